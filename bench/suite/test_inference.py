"""Inference: compiled forward passes compared with eager."""

import torch
import torch.nn.functional as F


def check(model, *inputs):
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)


def test_mlp_inference(mlp):
    check(mlp, torch.randn(8, 16))


def test_mlp_two_batch_sizes(mlp):
    check(mlp, torch.randn(4, 16))
    check(mlp, torch.randn(12, 16))


def test_convnet_inference(convnet):
    convnet.eval()
    check(convnet, torch.randn(2, 3, 16, 16))


def test_block_inference(block):
    block.eval()
    check(block, torch.randn(2, 8, 32))


def test_embedding_bag_classifier():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 3)

    def classify(tokens):
        pooled = emb(tokens).mean(dim=1)
        return F.log_softmax(head(pooled), dim=-1)

    check(classify, torch.randint(0, 100, (4, 7)))


def test_pipeline_of_two_compiled_stages(mlp):
    def preprocess(x):
        return (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-5)

    def postprocess(logits):
        return torch.topk(torch.softmax(logits, dim=-1), 2).values

    x = torch.randn(8, 16)
    with torch.no_grad():
        out = torch.compile(postprocess)(torch.compile(mlp)(torch.compile(preprocess)(x)))
        torch.testing.assert_close(out, postprocess(mlp(preprocess(x))), rtol=1e-4, atol=1e-4)
