""""No remat" is the model without remat: its compiled step equals, byte for
byte, the one of the same model rebuilt by its user without remat (Flax
Linen ``nn.remat``, NNX ``nnx.remat``, Equinox ``filter_checkpoint``,
``jax.checkpoint``)."""

import jax
import jax.numpy as jnp
import pytest

from remat_explorer.analysis import NO_REMAT, compile_costs
from tests import framework_models


def _mlp(remat, seed=0):
  keys = jax.random.split(jax.random.key(seed), 4)
  ws = [jax.random.normal(k, (24, 24)) / 5 for k in keys[:3]]
  x = jax.random.normal(keys[3], (6, 24))
  layer = lambda w, h: jnp.sin(jnp.tanh(h @ w) @ w.T)
  if remat:
    layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_saveable)

  def loss(ws, x):
    for w in ws:
      x = layer(w, x)
    return jnp.mean(x ** 2)
  return loss, (ws, x)


BUILDERS = {**framework_models.MODELS, 'jax.checkpoint': _mlp}
_FIGURES = ('argument_bytes', 'output_bytes', 'alias_bytes', 'temp_bytes',
            'peak_bytes', 'xla_flops')


@pytest.mark.parametrize('name', list(BUILDERS))
def test_no_remat_is_the_model_rebuilt_without_remat(name):
  build = BUILDERS[name]
  sizes = {} if name == 'jax.checkpoint' else dict(batch=2, seq=8)
  loss, args = build(remat=True, **sizes)
  plain, plain_args = build(remat=False, **sizes)
  ours = compile_costs(loss, *args, policy=NO_REMAT)
  theirs = compile_costs(plain, *plain_args)
  assert {k: getattr(ours, k) for k in _FIGURES} == {k: getattr(theirs, k) for k in _FIGURES}
  assert ours.timeline.peak_bytes == theirs.timeline.peak_bytes
  # Every other number of XLA's memory analysis too; on the NNX model the
  # CPU's peak_memory_in_bytes (arguments and outputs only) is 8 bytes apart
  # under JAX 0.10's XLA, equal under 0.11's.
  differing = {k for k in ours.memory_analysis
               if ours.memory_analysis[k] != theirs.memory_analysis.get(k)}
  assert differing <= ({'peak_memory_in_bytes'} if name == 'nnx' else set())
  # And the model with remat differs from both: the check is not vacuous.
  with_remat = compile_costs(loss, *args)
  assert (with_remat.temp_bytes, with_remat.xla_flops) != (theirs.temp_bytes, theirs.xla_flops)
