"""Training steps: forward, backward and optimizer step compiled (several graphs each)."""

import torch
import torch.nn.functional as F


def train_steps(model, make_batch, loss_fn, opt, steps=2):
    compiled = torch.compile(model)
    losses = []
    for _ in range(steps):
        x, y = make_batch()
        opt.zero_grad()
        loss = loss_fn(compiled(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def test_mlp_sgd_step(mlp):
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    losses = train_steps(mlp, lambda: (torch.randn(8, 16), torch.randint(0, 4, (8,))), F.cross_entropy, opt)
    assert all(torch.isfinite(loss) for loss in losses)


def test_mlp_adamw_compiled_step(mlp):
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    @torch.compile
    def step():
        opt.step()

    loss = F.cross_entropy(torch.compile(mlp)(x), y)
    loss.backward()
    step()
    assert torch.isfinite(loss)


def test_convnet_training_step(convnet):
    opt = torch.optim.SGD(convnet.parameters(), lr=0.05, momentum=0.9)
    losses = train_steps(convnet, lambda: (torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))), F.cross_entropy, opt)
    assert all(torch.isfinite(loss) for loss in losses)


def test_block_training_step(block):
    opt = torch.optim.Adam(block.parameters(), lr=1e-3)
    losses = train_steps(block, lambda: (torch.randn(2, 8, 32), torch.randn(2, 8, 32)), F.mse_loss, opt)
    assert all(torch.isfinite(loss) for loss in losses)


def test_regression_with_graph_break():
    torch.manual_seed(0)
    w = torch.randn(16, 1, requires_grad=True)

    def loss_fn(x, y):
        pred = x @ w
        torch._dynamo.graph_break()  # two graphs, each with its own backward
        return ((pred - y) ** 2).mean()

    compiled = torch.compile(loss_fn)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    loss = compiled(x, y)
    loss.backward()
    expected = torch.autograd.grad(loss_fn(x, y), w)[0]
    torch.testing.assert_close(w.grad, expected)


def test_gradient_clipping_step(mlp):
    @torch.compile
    def clip_and_scale(params, max_norm):
        grads = [p.grad for p in params]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        return [g * scale for g in grads]

    F.cross_entropy(torch.compile(mlp)(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
    params = list(mlp.parameters())
    clipped = clip_and_scale(params, 0.5)
    assert torch.sqrt(sum((g * g).sum() for g in clipped)) <= 0.5 + 1e-4
