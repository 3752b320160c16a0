"""ResNet-18 / WideResNet-18 / Swin: shapes, block deletion, maskability and residual scaling."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slimpar.models.resnet import BasicBlock, ResNet, ResNetConfig, resnet18, wrn18
from slimpar.models.swin import Swin, SwinConfig


def _forward_backward(model: torch.nn.Module, x: torch.Tensor, num_classes: int) -> None:
    logits = model(x)
    assert logits.shape == (x.shape[0], num_classes)
    logits.logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_resnet18_param_count_matches_reference() -> None:
    assert resnet18(num_classes=10, in_channels=3).num_params() == 11_173_962


def test_resnet18_and_wrn18_forward_backward() -> None:
    torch.manual_seed(0)
    _forward_backward(resnet18(num_classes=10, in_channels=3), torch.randn(2, 3, 8, 8), 10)
    wide = wrn18(num_classes=7, in_channels=1, width=2)
    assert wide.fc.in_features == 1024 and wide.blocks["0"].conv1.out_channels == 128
    _forward_backward(wide, torch.randn(2, 1, 8, 8), 7)


def test_resnet_non_maskable_blocks_are_exactly_the_projections() -> None:
    model = resnet18()
    for key, block in model.blocks.items():
        projects = block.conv1.stride != (1, 1) or block.conv1.in_channels != block.conv2.out_channels
        assert block.maskable == (not projects), key
        assert (block.shortcut is None) == block.maskable, key
    assert [k for k, b in model.blocks.items() if not b.maskable] == ["2", "4", "6"]


def test_resnet_block_deletion_keeps_names_and_runs() -> None:
    torch.manual_seed(0)
    model = ResNet(ResNetConfig(widths=(8, 16, 16, 32), num_classes=5, in_channels=3))
    before = dict(model.named_parameters())
    maskable = [k for k, b in model.blocks.items() if b.maskable]
    for key in maskable[:3]:
        del model.blocks[key]
    after = dict(model.named_parameters())
    gone = {n for n in before if any(n.startswith(f"blocks.{k}.") for k in maskable[:3])}
    assert gone and set(after) == set(before) - gone
    for name, p in after.items():
        assert p is before[name]
    _forward_backward(model, torch.randn(3, 3, 8, 8), 5)


def test_resnet_forward_equals_manual_composition_of_present_blocks() -> None:
    torch.manual_seed(0)
    model = ResNet(ResNetConfig(widths=(8, 16, 16, 32), num_classes=4)).eval()
    del model.blocks["1"], model.blocks["7"]
    x = torch.randn(2, 3, 8, 8)
    h = F.relu(model.bn1(model.conv1(x)))
    for key in ["0", "2", "3", "4", "5", "6"]:
        h = model.blocks[key](h)
    torch.testing.assert_close(model(x), model.fc(h.mean(dim=(2, 3))))


def test_basic_block_residual_scale_zero_is_relu_of_shortcut() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    identity = BasicBlock(8, 8, stride=1).eval()
    identity.residual_scale = 0.0
    torch.testing.assert_close(identity(x), F.relu(x))
    proj = BasicBlock(8, 16, stride=2).eval()
    proj.shortcut[1].running_mean.normal_()  # non-trivial BN statistics so the check is not vacuous
    proj.residual_scale = 0.0
    conv, bn = proj.shortcut
    expected = F.relu(
        (F.conv2d(x, conv.weight, stride=2) - bn.running_mean.view(1, -1, 1, 1))
        / torch.sqrt(bn.running_var.view(1, -1, 1, 1) + bn.eps)
        * bn.weight.view(1, -1, 1, 1)
        + bn.bias.view(1, -1, 1, 1)
    )
    torch.testing.assert_close(proj(x), expected)


def test_basic_block_residual_scale_scales_the_branch() -> None:
    torch.manual_seed(0)
    block = BasicBlock(4, 4).eval()
    x = torch.randn(2, 4, 5, 5)
    branch = block.bn2(block.conv2(F.relu(block.bn1(block.conv1(x)))))
    block.residual_scale = 0.5
    torch.testing.assert_close(block(x), F.relu(0.5 * branch + x))


def _small_swin(img: int, channels: int) -> Swin:
    cfg = SwinConfig.tiny(
        img_size=img,
        in_channels=channels,
        num_classes=10,
        embed_dim=16,
        depths=(2, 2, 2, 2),
        heads=(1, 2, 2, 4),
    )
    return Swin(cfg)


def test_swin_forward_backward_28px_gray_and_32px_rgb() -> None:
    torch.manual_seed(0)
    gray = _small_swin(28, 1)
    assert gray.cfg.padded_size == 32 and gray.cfg.stage_resolutions() == [16, 8, 4, 2]
    _forward_backward(gray, torch.randn(2, 1, 28, 28), 10)
    _forward_backward(_small_swin(32, 3), torch.randn(2, 3, 32, 32), 10)
    tiny = Swin(SwinConfig.tiny(img_size=32, in_channels=3))
    assert len(tiny.blocks) == sum(tiny.cfg.depths) and sorted(tiny.merges) == ["0", "1", "2"]
    assert tiny(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_swin_shifts_alternate_where_the_grid_has_several_windows() -> None:
    model = _small_swin(32, 3)
    meta = [(b.stage, b.res, b.window, b.shift) for b in model.blocks.values()]
    assert meta == [
        (0, 16, 4, 0),
        (0, 16, 4, 2),
        (1, 8, 4, 0),
        (1, 8, 4, 2),
        (2, 4, 4, 0),
        (2, 4, 4, 0),
        (3, 2, 2, 0),
        (3, 2, 2, 0),
    ]
    assert all(b.maskable for b in model.blocks.values())


def _influence(block: torch.nn.Module, res: int, dim: int, token: tuple[int, int]) -> set[tuple[int, int]]:
    """Grid positions whose block output changes when the input token at ``token`` changes."""
    torch.manual_seed(1)
    block = block.double()  # masked pairs keep a weight of exp(-100); real dependencies are ~1e-5
    x = torch.randn(1, res, res, dim, dtype=torch.float64)
    y = x.clone()
    y[0, token[0], token[1]] += torch.randn(dim, dtype=torch.float64)  # not constant: LayerNorm removes that
    changed = (block(x) - block(y)).abs().amax(-1)[0] > 1e-12  # (res, res)
    return {tuple(p) for p in changed.nonzero().tolist()}


def test_shifted_window_mask_blocks_wraparound_attention() -> None:
    model = _small_swin(32, 3)
    plain, shifted = model.blocks["0"], model.blocks["1"]  # 16x16 grid, 4x4 windows, shift 2
    with torch.no_grad():
        square = {(i, j) for i in range(4, 8) for j in range(4, 8)}
        assert _influence(plain, 16, 16, (5, 5)) == square
        assert _influence(shifted, 16, 16, (5, 5)) == {(i, j) for i in range(2, 6) for j in range(2, 6)}
        # After the cyclic shift the corner shares a window with the far edges; the mask keeps it local.
        assert _influence(shifted, 16, 16, (0, 0)) == {(i, j) for i in range(2) for j in range(2)}


def test_swin_block_deletion_keeps_names_and_runs() -> None:
    torch.manual_seed(0)
    model = _small_swin(28, 1)
    before = dict(model.named_parameters())
    for key in ["1", "2", "3", "7"]:  # includes a whole stage (blocks 2 and 3)
        del model.blocks[key]
    after = dict(model.named_parameters())
    assert set(after) == {n for n in before if not n.startswith(("blocks.1.", "blocks.2.", "blocks.3.", "blocks.7."))}
    _forward_backward(model, torch.randn(2, 1, 28, 28), 10)


def test_swin_residual_scale_zero_is_identity_and_deletion_equivalent() -> None:
    torch.manual_seed(0)
    model = _small_swin(32, 3)
    x = torch.randn(2, 3, 32, 32)
    h = torch.randn(2, 16, 16, 16)
    model.blocks["1"].residual_scale = 0.0
    torch.testing.assert_close(model.blocks["1"](h), h)
    with torch.no_grad():
        scaled = model(x)
        del model.blocks["1"]
        torch.testing.assert_close(model(x), scaled)
