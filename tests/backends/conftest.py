"""Fixtures of the backend-agnostic suite, parametrized over the keras and torch kits
(tests/support/backend_kits.py). Expensive work (training, QAT, conversions) happens once per backend
for the whole folder."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.artifact_checks import export_both, score
from support.backend_kits import KITS

from compressor.core.context import Data, ModelState
from compressor.config.steps import PrecisionConfig, PruneConfig, QuantizeConfig


@pytest.fixture(scope="package", params=sorted(KITS))
def backend_name(request) -> str:
    return request.param


@pytest.fixture(scope="package")
def kit(backend_name):
    kit = KITS[backend_name]()
    kit.setup()
    yield kit
    kit.teardown()


@pytest.fixture(scope="package")
def data(kit) -> Data:
    return kit.data


@pytest.fixture(scope="package")
def backend(kit):
    return kit.backend


@pytest.fixture(scope="package")
def workdir(tmp_path_factory, backend_name) -> Path:
    return tmp_path_factory.mktemp(backend_name)


@pytest.fixture(scope="package")
def ctx(kit, workdir):
    return kit.context(None, workdir / "work")


@pytest.fixture(scope="package")
def float_model(kit):
    return kit.trained_cnn()


@pytest.fixture(scope="package")
def float_accuracy(backend, float_model, data) -> float:
    accuracy = score(backend.predict(float_model, data.val[0]), data)
    assert accuracy >= 0.95, "the test model itself must be good for drops to mean anything"
    return accuracy


@pytest.fixture(scope="package")
def fp32(backend, float_model, ctx, workdir):
    return export_both(backend, ModelState(model=backend.load(float_model)), ctx,
                       workdir / "fp32")


@pytest.fixture(scope="package")
def int8_prune30_state(kit, backend, float_model, ctx) -> ModelState:
    state = kit.apply(ModelState(model=backend.load(float_model)),
                      PruneConfig(sparsity=0.30, schedule="polynomial", epochs=2), ctx)
    return kit.apply(state, QuantizeConfig(mode="qat", epochs=2, preserve_sparsity=True), ctx)


@pytest.fixture(scope="package")
def int8_prune30(backend, int8_prune30_state, ctx, workdir):
    return export_both(backend, int8_prune30_state, ctx, workdir / "int8_prune30")


@pytest.fixture(scope="package")
def ptq_run(kit, backend, float_model, ctx, workdir) -> dict:
    """PTQ straight on the caller's model (no load()), with its weights from before."""
    before = kit.weights(float_model)
    state = kit.apply(ModelState(model=float_model),
                      QuantizeConfig(mode="ptq", calibration_samples=256), ctx)
    return {"weights_before": before,
            "artifacts": export_both(backend, state, ctx, workdir / "ptq")}


@pytest.fixture(scope="package")
def ptq(ptq_run) -> dict[str, Path]:
    return ptq_run["artifacts"]


@pytest.fixture(scope="package")
def fp16(kit, backend, float_model, ctx, workdir):
    state = kit.apply(ModelState(model=backend.load(float_model)),
                      PrecisionConfig(dtype="float16"), ctx)
    return export_both(backend, state, ctx, workdir / "fp16")
