"""fuel_torch.nn: drop-in Conv2d / ConvTranspose2d and convert(), against torch's own modules."""
import copy
import warnings

import pytest
import torch

import fuel_torch
from fuel_torch import nn as fnn

CONV_CONFIGS = [
    dict(in_channels=3, out_channels=5, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
    dict(in_channels=4, out_channels=4, kernel_size=3, padding="same", dilation=2, groups=4, bias=False),
    dict(in_channels=2, out_channels=3, kernel_size=(5, 3), padding="same"),
    dict(in_channels=2, out_channels=3, kernel_size=2, padding="valid", stride=2),
]
TRANSPOSE_CONFIGS = [
    dict(in_channels=3, out_channels=5, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
         groups=2),
    dict(in_channels=4, out_channels=4, kernel_size=3, stride=1, dilation=2, output_padding=1, groups=4, bias=False),
]
PAIRS = ([(torch.nn.Conv2d, fnn.Conv2d, c) for c in CONV_CONFIGS]
         + [(torch.nn.ConvTranspose2d, fnn.ConvTranspose2d, c) for c in TRANSPOSE_CONFIGS])


def pair_id(pair):
    return f"{pair[1].__name__}-" + "-".join(f"{k}={v}" for k, v in pair[2].items())


def build_both(torch_cls, fuel_cls, config, dtype=torch.float64):
    torch.manual_seed(0)
    theirs = torch_cls(**config, dtype=dtype)
    torch.manual_seed(0)
    ours = fuel_cls(**config, dtype=dtype)
    return theirs, ours


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_same_parameters_init_and_state_dict(pair):
    theirs, ours = build_both(*pair)
    assert isinstance(ours, pair[0])
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    assert all(torch.equal(ours_sd[k], theirs_sd[k]) for k in ours_sd)  # same init, same RNG draws
    # state_dicts load across in both directions.
    fresh = pair[1](**pair[2], dtype=torch.float64)
    fresh.load_state_dict(theirs_sd)
    assert all(torch.equal(fresh.state_dict()[k], theirs_sd[k]) for k in theirs_sd)
    theirs.load_state_dict(ours.state_dict())


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_forward_and_backward_match_torch(pair):
    theirs, ours = build_both(*pair)
    x = torch.randn(2, pair[2]["in_channels"], 7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    inputs = {
        "batched": x,
        "unbatched": x[0],
        "channels_last": x.to(memory_format=torch.channels_last),
        "offset": torch.cat([x, x])[2:],
    }
    for name, inp in inputs.items():
        a, b = inp.clone().requires_grad_(), inp.clone().requires_grad_()
        out_ours, out_theirs = ours(a), theirs(b)
        torch.testing.assert_close(out_ours, out_theirs, rtol=1e-12, atol=1e-12, msg=name)
        grad = torch.randn_like(out_theirs)
        got = torch.autograd.grad(out_ours, [a, *ours.parameters()], grad)
        want = torch.autograd.grad(out_theirs, [b, *theirs.parameters()], grad)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=name)


def test_conv_transpose_output_size_argument():
    theirs, ours = build_both(torch.nn.ConvTranspose2d, fnn.ConvTranspose2d,
                              dict(in_channels=2, out_channels=3, kernel_size=3, stride=2, padding=1))
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64)
    for size in ([7, 9], [8, 10], [1, 3, 8, 9]):
        out = ours(x, output_size=size)
        assert out.shape[-2:] == tuple(size[-2:])
        torch.testing.assert_close(out, theirs(x, output_size=size), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="requested an output size of"):
        ours(x, output_size=[10, 10])


@pytest.mark.parametrize("cls, kwargs, reason", [
    (fnn.Conv2d, dict(padding_mode="reflect", padding=1), "padding_mode='reflect': fuel kernels pad with zeros only"),
    (fnn.Conv2d, dict(padding="same", kernel_size=4), "padding='same' with kernel_size=(4, 4), dilation=(1, 1) pads "
                                                      "asymmetrically"),
    (fnn.Conv2d, dict(dtype=torch.complex64), "weight has dtype torch.complex64: fuel kernels serve"),
    (fnn.ConvTranspose2d, dict(dtype=torch.complex64), "weight has dtype torch.complex64"),
])
def test_unsupported_configurations_are_refused_with_the_reason(cls, kwargs, reason):
    args = dict(in_channels=2, out_channels=2, kernel_size=3) | kwargs
    with pytest.raises(ValueError, match=rf"fuel_torch\.nn\.{cls.__name__}: {reason}".replace("(", r"\(")
                       .replace(")", r"\)")):
        cls(**args)


class Subclassed(torch.nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        shared = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, stride=2, padding=1), torch.nn.ReLU(), shared, torch.nn.ReLU(), shared)
        self.reflect = torch.nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.asymmetric = torch.nn.Conv2d(4, 4, 2, padding="same")
        self.custom = Subclassed(4, 4, 1)
        self.head = torch.nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1)
        self.conv1d = torch.nn.Conv1d(1, 1, 1)  # not a 2-d convolution: not convert()'s business

    def forward(self, x):
        h = self.custom(self.asymmetric(self.reflect(self.body(x))))
        return self.head(h)


def test_convert_swaps_in_place_and_reports_what_it_leaves():
    torch.manual_seed(0)
    model = Model().double()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    before = model(x)
    params = {name: p for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(fnn.ConversionWarning) as caught:
        report = fnn.convert(model)
    assert sorted(report.converted) == ["body.0", "body.2", "head"]
    assert set(report.skipped) == {"reflect", "asymmetric", "custom"}
    assert "padding_mode='reflect'" in report.skipped["reflect"]
    assert "pads asymmetrically" in report.skipped["asymmetric"]
    assert "Subclassed subclasses torch.nn.Conv2d" in report.skipped["custom"]
    assert len(caught) == 3 and all("left" in str(w.message) for w in caught)
    assert "3 converted, 3 left on torch" in str(report)
    assert type(model.body[0]) is fnn.Conv2d and type(model.head) is fnn.ConvTranspose2d
    assert model.body[2] is model.body[4] and type(model.body[2]) is fnn.Conv2d  # shared module, swapped once
    assert type(model.reflect) is torch.nn.Conv2d and type(model.custom) is Subclassed
    assert type(model.conv1d) is torch.nn.Conv1d
    assert all(p is params[name] for name, p in model.named_parameters())  # the very same Parameters
    torch.testing.assert_close(model(x), before, rtol=1e-12, atol=1e-12)
    # The optimizer built before the swap still trains the converted model.
    log = []
    model.body[0].register_forward_hook(lambda module, args, out: log.append(type(module)))
    loss = model(x).square().mean()
    loss.backward()
    old = model.body[0].weight.detach().clone()
    optimizer.step()
    assert log == [fnn.Conv2d] and not torch.equal(model.body[0].weight, old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fnn.ConversionWarning)
        again = fnn.convert(torch.nn.Sequential(copy.deepcopy(model.body[0])))
    assert again.converted == [] and again.skipped == {}  # already fuel: nothing to do, nothing to warn


def test_convert_root_module_and_unsupported_dtype():
    conv = torch.nn.Conv2d(2, 2, 3)
    assert fnn.convert(conv).converted == [""] and type(conv) is fnn.Conv2d
    complex_conv = torch.nn.Conv2d(2, 2, 3, dtype=torch.complex64)
    with pytest.warns(fnn.ConversionWarning, match="dtype torch.complex64"):
        report = fnn.convert(complex_conv)
    assert report.converted == [] and type(complex_conv) is torch.nn.Conv2d


def test_modules_run_on_fuel_kernels():
    ours = fnn.Conv2d(2, 3, 3)
    x = torch.randn(1, 2, 5, 5)
    with pytest.raises(RuntimeError, match=r"fuel::conv2d \[\w+\]: argument 'weight' breaks `dtypes"):
        ours(x.double())  # the op's own contract message: a fuel kernel, not torch's conv, saw the call
    assert fuel_torch.nn.Conv2d is fnn.Conv2d
