"""Convolutions: 1d, 2d, depthwise, transposed, with fused epilogues."""

import torch
import torch.nn.functional as F


def check(fn, *inputs):
    torch.testing.assert_close(torch.compile(fn)(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)


def test_conv2d_relu():
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    check(lambda x: F.relu(F.conv2d(x, w, b, padding=1)), torch.randn(2, 3, 10, 10))


def test_conv1d_gelu_residual():
    w = torch.randn(6, 6, 5)
    check(lambda x: x + F.gelu(F.conv1d(x, w, padding=2)), torch.randn(2, 6, 20))


def test_depthwise_separable():
    dw, pw = torch.randn(8, 1, 3, 3), torch.randn(16, 8, 1, 1)
    check(lambda x: F.conv2d(F.silu(F.conv2d(x, dw, padding=1, groups=8)), pw), torch.randn(1, 8, 9, 9))


def test_conv_transpose_upsample():
    w = torch.randn(4, 2, 2, 2)
    check(lambda x: torch.tanh(F.conv_transpose2d(x, w, stride=2)), torch.randn(1, 4, 5, 5))


def test_conv_pool_batchnorm_eval(convnet):
    convnet.eval()
    with torch.no_grad():
        check(convnet, torch.randn(3, 3, 8, 8))
