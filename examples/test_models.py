"""A tiny suite of compiled CPU tests: what a team's model tests look like, only smaller."""

import torch
import torch.nn.functional as F


def test_activation_matches_eager():
    def fn(x):
        return torch.sin(x) * torch.sigmoid(x) + x.relu()

    x = torch.randn(64)
    torch.testing.assert_close(torch.compile(fn)(x), fn(x))


def test_mlp_inference(mlp):
    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(mlp)(x), mlp(x))


def test_training_step(mlp):
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    compiled = torch.compile(mlp)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = F.cross_entropy(compiled(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)


def test_layer_norm_loss():
    def fn(x, w):
        return F.layer_norm(x, (32,), w).pow(2).mean()

    x, w = torch.randn(4, 32), torch.randn(32)
    torch.testing.assert_close(torch.compile(fn)(x, w), fn(x, w))


def test_attention():
    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v

    q, k, v = (torch.randn(2, 8, 16) for _ in range(3))
    torch.testing.assert_close(torch.compile(attend)(q, k, v), attend(q, k, v))


def test_eager_only():
    assert torch.ones(3).sum() == 3
