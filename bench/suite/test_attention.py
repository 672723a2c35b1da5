"""Attention variants: hand-written, scaled_dot_product_attention, masks."""

import torch
import torch.nn.functional as F


def test_softmax_attention():
    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v

    q, k, v = (torch.randn(2, 8, 16) for _ in range(3))
    torch.testing.assert_close(torch.compile(attend)(q, k, v), attend(q, k, v))


def test_sdpa_causal():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 4, 8, 8) for _ in range(3))
    torch.testing.assert_close(torch.compile(attend)(q, k, v), attend(q, k, v), rtol=1e-4, atol=1e-4)


def test_masked_attention():
    def attend(q, k, v, mask):
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    q, k, v = (torch.randn(2, 6, 8) for _ in range(3))
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    torch.testing.assert_close(torch.compile(attend)(q, k, v, mask), attend(q, k, v, mask))


def test_multi_head_attention_module():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(mha)(x, x, x)[0], mha(x, x, x)[0], rtol=1e-4, atol=1e-4)


def test_attention_backward():
    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1) @ v

    q, k, v = (torch.randn(2, 6, 8, requires_grad=True) for _ in range(3))
    torch.compile(attend)(q, k, v).sum().backward()
    compiled_grad = q.grad.clone()
    q.grad = None
    attend(q, k, v).sum().backward()
    torch.testing.assert_close(compiled_grad, q.grad, rtol=1e-4, atol=1e-4)
