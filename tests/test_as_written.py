"""The program is analysed as its user wrote it: no remat block added
unasked, aux outputs not differentiated, a training step refused, a jitted
function read as its inner function, non-array leaves held, and caches that
never answer for another setting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer.analysis import analyze, compile_costs
from tests.parity import jax_residual_bytes

RNG = np.random.default_rng(20261123)


def _normal(*shape):
  return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


def _mlp_params():
  return [(_normal(32, 48), _normal(48)), (_normal(48, 32), _normal(32))]


def plain_loss(params, x):
  for w, b in params:
    x = jnp.tanh(x @ w + b)
  return jnp.mean(x ** 2)


def _xla_flops(step, *args):
  return jax.jit(step).lower(*args).compile().cost_analysis()['flops']


def test_a_function_without_remat_is_analysed_and_compiled_as_written():
  params, x = _mlp_params(), _normal(16, 32)
  # JAX's saved_residuals differentiates every argument: so does this report.
  report = analyze(plain_loss, params, x, argnums=(0, 1))
  assert report.blocks == () and 'no remat block' in report.notes[0]
  assert report.residual_bytes == jax_residual_bytes(plain_loss, params, x)
  costs = compile_costs(plain_loss, params, x)
  assert costs.xla_flops == _xla_flops(jax.value_and_grad(plain_loss), params, x)
  # Asking for a policy checkpoints it as a whole, and says so.
  wrapped = analyze(plain_loss, params, x, argnums=(0, 1),
                    policy=rx.checkpoint_policies.nothing_saveable)
  assert [b.name for b in wrapped.blocks] == ['plain_loss']
  assert 'checkpointed as a whole' in wrapped.notes[0]
  assert wrapped.residual_bytes < report.residual_bytes


def loss_and_aux(params, x):
  h = x
  for w, b in params:
    h = jnp.tanh(h @ w + b)
  return jnp.mean(h ** 2), {'activations': h, 'norm': jnp.sum(jnp.abs(h))}


def test_has_aux_differentiates_the_loss_only():
  params, x = _mlp_params(), _normal(16, 32)
  report = analyze(loss_and_aux, params, x, has_aux=True, argnums=(0, 1))
  loss_only = lambda p, x: loss_and_aux(p, x)[0]
  assert report.residual_bytes == jax_residual_bytes(loss_only, params, x)
  assert report.has_aux and not report.warnings
  costs = compile_costs(loss_and_aux, params, x, has_aux=True)
  assert costs.xla_flops == _xla_flops(
      jax.value_and_grad(loss_and_aux, has_aux=True), params, x)
  # Without has_aux the aux would be differentiated too: refused, naming has_aux.
  with pytest.raises(TypeError, match='pass has_aux=True'):
    analyze(loss_and_aux, params, x, argnums=(0, 1))


def test_has_aux_needs_a_pair():
  params, x = _mlp_params(), _normal(16, 32)
  with pytest.raises(TypeError, match=r'has_aux=True expects .*plain_loss.* pair'):
    analyze(plain_loss, params, x, has_aux=True)


def test_a_training_step_is_refused_naming_the_loss():
  params, x = _mlp_params(), _normal(16, 32)

  def train_step(params, x):
    grads = jax.grad(plain_loss)(params, x)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

  with pytest.raises(ValueError, match=r"train_step already differentiates.*'plain_loss'"):
    analyze(jax.jit(train_step), params, x)
  with pytest.raises(ValueError, match='already differentiates'):
    compile_costs(train_step, params, x)


def test_a_jitted_function_is_analysed_as_its_inner_function():
  params, x = _mlp_params(), _normal(16, 32)

  def loss(params, x):
    return plain_loss([(w, b) for w, b in params], x)

  jitted = analyze(jax.jit(jax.checkpoint(loss)), params, x)
  inner = analyze(jax.checkpoint(loss), params, x)
  assert jitted.function == 'loss'
  assert [r.description for r in jitted.residuals] == [r.description for r in inner.residuals]
  assert [b.name for b in jitted.blocks] == ['loss']


def test_leaves_that_are_not_arrays_are_held_as_eqx_filter_jit_holds_them():
  params, x = _mlp_params(), _normal(16, 32)

  def configured(params, x, config):
    h = x
    for w, b in params:
      h = h @ w + b
      h = jnp.tanh(h) if config['activation'] == 'tanh' else jax.nn.relu(h)
    return jnp.mean(h ** 2) * config['scale'] if config['training'] else 0.0

  config = {'activation': 'tanh', 'scale': 0.5, 'training': True}
  report = analyze(configured, params, x, config, argnums=(0, 1))
  assert report.residual_bytes == jax_residual_bytes(
      lambda p, x: configured(p, x, config), params, x)
  relu = analyze(configured, params, x, dict(config, activation='relu'), argnums=(0, 1))
  assert {r.primitive for r in relu.residuals} != {r.primitive for r in report.residuals}


def test_caches_answer_for_the_enclosing_lowering_strategy():
  params, x = _mlp_params(), _normal(16, 32)
  f = jax.checkpoint(plain_loss)
  outside = compile_costs(f, params, x)
  with rx.lowering_strategy('cond'):
    inside = compile_costs(f, params, x)
    assert analyze(f, params, x) is analyze(f, params, x)
  assert outside.lowered_matmuls is not None
  # The cond lowering keeps the recompute; where the barrier let XLA merge
  # it away (JAX 0.10's XLA:CPU does) the compiled programs differ.
  assert inside is not outside
  merged_under_barrier = outside.compiled_matmuls < outside.lowered_matmuls
  assert (inside.compiled_matmuls != outside.compiled_matmuls) == merged_under_barrier
  assert compile_costs(f, params, x) is outside


def test_clear_caches_forgets_results():
  params, x = _mlp_params(), _normal(16, 32)
  f = jax.checkpoint(plain_loss)
  first = analyze(f, params, x)
  assert analyze(f, params, x) is first
  rx.clear_caches()
  again = analyze(f, params, x)
  assert again is not first and again == first


@pytest.mark.parametrize('argnums, message', [
    ('params', r"argnums must be an int or a sequence of ints.*str 'params'"),
    (1.0, r'argnums must be an int or a sequence of ints.*float 1.0'),
    ((0, 'x'), r'argnums must be an int or a sequence of ints'),
])
def test_bad_argnums_say_what_argnums_takes(argnums, message):
  params, x = _mlp_params(), _normal(16, 32)
  with pytest.raises(TypeError, match=message):
    analyze(plain_loss, params, x, argnums=argnums)


def test_a_function_that_is_not_callable_is_named_briefly():
  params, x = _mlp_params(), _normal(64, 32)
  with pytest.raises(TypeError) as info:
    analyze(x, plain_loss, params)
  message = str(info.value)
  assert 'first argument' in message and 'float32[64, 32]' in message
  assert len(message) < 200


def test_a_number_passed_to_be_differentiated_is_traced_as_jax_grad_traces_it():
  f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
  report = analyze(f, 3.0)
  assert report.residual_bytes == jax_residual_bytes(f, 3.0)
  assert [b.name for b in report.blocks] == ['<lambda>']
