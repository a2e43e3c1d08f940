"""Keras fine-tuning under TF_CONFIG: one MultiWorkerMirroredStrategy per process.

With TF_CONFIG naming 2+ workers, every `fine_tune` (prune, QAT, distill) builds its model
inside the strategy's scope and feeds it a dataset sharded by element, so the workers train
one model data-parallel (gradients all-reduced each step, pruning masks computed from the same
weights on every worker). The strategy is made once, when TensorFlow is first imported:
collective ops must be configured before the process runs any TensorFlow op, and loading the
model already runs some. Nothing here imports TensorFlow: the caller passes it in.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compressor.core.cluster import tf_config_workers

_strategy: Any = None
_tf: Any = None


def join_workers(tf: Any) -> None:
    """Create the strategy when TF_CONFIG names 2+ workers (blocks until all have started)."""
    global _strategy, _tf
    if _strategy is None and tf_config_workers() > 1:
        _strategy, _tf = tf.distribute.MultiWorkerMirroredStrategy(), tf


def build_in_scope(build: Callable[[], Any], progress: Any) -> Any:
    """`build()` (the model to train, its optimizer), inside the strategy's scope when there is
    one (their variables become mirrored; compile and fit then run under the same strategy)."""
    if _strategy is None:
        return build()
    progress.info(f"data-parallel fine-tuning on {_strategy.num_replicas_in_sync} workers "
                  "(tf.distribute, TF_CONFIG)")
    with _strategy.scope():
        return build()


def sharded(dataset: Any) -> Any:
    """The batched training set, each global batch split by element across the workers.

    In-memory data has no files to shard, so the policy is DATA; every worker shuffles with
    the same seed, so together they see each example once per epoch.
    """
    if _strategy is None:
        return dataset
    options = _tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
