"""The planner's budget search against an injected predictor (slimpar.sdp.budget.keep_by_prediction), and the
memory prediction's image stand-in against the real image sets."""

import pytest

from slimpar.sdp.budget import keep_by_prediction
from slimpar.sdp.components import PlanError


def _linear(per_step: int, base: int, steps: int, calls: list):
    """Peaks of a model where a worker costs ``base`` plus ``per_step`` per step of keep it holds."""

    def predict(keeps):
        calls.append(list(keeps))
        return [base + round(k * steps) * per_step for k in keeps]

    return predict


def test_each_worker_gets_the_largest_keep_that_fits():
    calls = []
    keeps, peaks = keep_by_prediction(_linear(100, 1000, 4, calls), [1400, 1250, 1100], steps=4)
    assert keeps == [1.0, 0.5, 0.25] and peaks == [1400, 1200, 1100]
    assert calls == [[1.0, 1.0, 1.0], [1.0, 0.75, 0.75], [1.0, 0.5, 0.5], [1.0, 0.5, 0.25]]  # 3 < 4: no floor
    calls.clear()
    assert keep_by_prediction(_linear(100, 1000, 2, calls), [1200, 1100, 1100], steps=2)[0] == [1.0, 0.5, 0.5]
    assert calls == [[0.5] * 3, [1.0] * 3, [1.0, 0.5, 0.5]]  # one step each covers: the floor first


def test_budgets_that_cannot_be_met_name_the_worker_and_the_minimum():
    for n in (2, 4):  # found at one step, or first (the floor) where one step each covers the model
        calls = []
        with pytest.raises(PlanError, match=r"worker\(s\) \[1\] cannot hold even one component.*at least 1.1 KiB"):
            keep_by_prediction(_linear(100, 1000, 4, calls), [1400, 1050] + [1400] * (n - 2), steps=4)
        assert len(calls) == (4 if n == 2 else 1)
    with pytest.raises(PlanError, match="min_holders=2 needs 8"):
        keep_by_prediction(_linear(100, 1000, 4, []), [1400, 1200], steps=4, min_holders=2)


@pytest.mark.parametrize("image_set", ["digits", pytest.param("fashion_mnist", marks=pytest.mark.slow)])
def test_image_stand_in_has_the_real_shapes(image_set):
    from slimpar.data.images import ImageData
    from slimpar.train.memory.stand_ins import FakeImages

    real, fake = ImageData(image_set), FakeImages(image_set)
    assert (fake.channels, fake.size, fake.num_classes) == (real.channels, real.size, real.num_classes)
    for a, b in zip(real.train_batch(3, 1, 2, 16), fake.train_batch(3, 1, 2, 16), strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
