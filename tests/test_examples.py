"""The example models: real losses, real gradients, real checkpoint names."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_explorer as rx
from remat_explorer import examples
from tests.by_hand import xla_compiles
from tests.parity import jax_residual_bytes

policies = rx.checkpoint_policies

SMALL = {
    'mlp': dict(num_layers=3, width=16, batch=4),
    'transformer': dict(num_layers=2, d_model=16, num_heads=2, seq_len=8,
                        batch=2),
    'transformer_scan': dict(num_layers=2, d_model=16, num_heads=2, seq_len=8,
                             batch=2, use_scan=True),
    'convnet': dict(num_blocks=2, channels=4, image_size=8, batch=2,
                    num_classes=3),
}
NAMES = {
    'mlp': examples.MLP_NAMES,
    'transformer': examples.TRANSFORMER_NAMES,
    'transformer_scan': examples.TRANSFORMER_NAMES,
    'convnet': examples.CONVNET_NAMES,
}
CASES = sorted(SMALL)
# Built once: a policy is part of the cache key of `run` below.
POLICIES = {
    'nothing': policies.nothing_saveable,
    'everything': policies.everything_saveable,
    **{f'names_{case}': policies.save_only_these_names(*NAMES[case][:2])
       for case in CASES},
}


def small(case, **kwargs):
  return examples.build(case.removesuffix('_scan'), **SMALL[case], **kwargs)


# Compiling takes most of these tests' time; LLVM's optimisations, half of it.
FAST_COMPILE = {'xla_backend_optimization_level': 0}


@functools.lru_cache(maxsize=None)
def run(case, policy=None, remat=True):
  """``(args, loss, grads)`` of a small model, computed once."""
  loss_fn, args = small(case, policy=policy, remat=remat)
  lowered = jax.jit(jax.value_and_grad(loss_fn)).lower(*args)
  return args, *lowered.compile(FAST_COMPILE)(*args)


def assert_trees_close(a, b, rtol, atol=0.0):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize('case', CASES)
def test_loss_is_finite_float32_scalar_and_grad_matches_params(case):
  (params, _), loss, grads = run(case)
  assert loss.shape == () and loss.dtype == jnp.float32
  assert np.isfinite(loss)
  assert (jax.tree_util.tree_structure(grads)
          == jax.tree_util.tree_structure(params))
  for g, p in zip(jax.tree_util.tree_leaves(grads),
                  jax.tree_util.tree_leaves(params)):
    assert g.shape == p.shape and g.dtype == jnp.float32
    assert np.all(np.isfinite(g))
  # Every param array reaches the loss: none is dead weight in the example.
  assert all(np.any(g != 0) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize('case', CASES)
def test_remat_false_is_the_same_math(case):
  args, loss, grads = run(case)
  args_plain, loss_plain, grads_plain = run(case, remat=False)
  assert_trees_close(args, args_plain, rtol=0)
  np.testing.assert_allclose(loss, loss_plain, rtol=1e-6)
  assert_trees_close(grads, grads_plain, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('case', CASES)
def test_remat_false_has_no_checkpoint(case):
  loss_fn, args = small(case, remat=False)
  assert 'checkpoint[' not in str(jax.make_jaxpr(loss_fn)(*args))
  loss_fn, args = small(case)
  assert 'checkpoint[' in str(jax.make_jaxpr(loss_fn)(*args))


@pytest.mark.parametrize('case', CASES)
def test_seed_determines_args(case):
  _, a = small(case, seed=3)
  _, b = small(case, seed=3)
  _, c = small(case, seed=4)
  assert_trees_close(a, b, rtol=0)
  pairs = list(zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(c)))
  # Zero biases and unit LayerNorm scales are the same for every seed;
  # every array drawn at random must differ.
  drawn = [(x, y) for x, y in pairs if np.unique(np.asarray(x)).size > 1]
  assert drawn and all(not np.array_equal(x, y) for x, y in drawn)


# The scanned transformer is left out to save compiles; its gradients are
# compared with the unrolled one's below.
@pytest.mark.parametrize('case', ['convnet', 'mlp', 'transformer'])
@pytest.mark.parametrize('policy', ['everything', 'names'])
def test_gradients_agree_across_policies(case, policy):
  policy = POLICIES[f'names_{case}' if policy == 'names' else policy]
  _, loss, grads = run(case, policy=POLICIES['nothing'])
  _, loss_other, grads_other = run(case, policy=policy)
  np.testing.assert_allclose(loss, loss_other, rtol=1e-6)
  assert_trees_close(grads, grads_other, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('case', CASES)
def test_checkpoint_names_are_in_the_program(case):
  loss_fn, args = small(case)
  text = str(jax.make_jaxpr(loss_fn)(*args))
  for name in NAMES[case]:
    assert f'name[name={name}]' in text, name


def test_names_constants_are_distinct_strings():
  for names in (examples.MLP_NAMES, examples.TRANSFORMER_NAMES,
                examples.CONVNET_NAMES):
    assert names and len(set(names)) == len(names)
    assert all(isinstance(n, str) for n in names)


def test_transformer_scan_and_loop_hold_the_same_numbers():
  (loop_params, loop_batch), loop_loss, loop_grads = run('transformer')
  (scan_params, scan_batch), scan_loss, scan_grads = run('transformer_scan')
  stack = lambda layers: jax.tree_util.tree_map(lambda *xs: jnp.stack(xs),
                                                *layers)
  assert_trees_close({**loop_params, 'blocks': stack(loop_params['blocks'])},
                     scan_params, rtol=0)
  assert_trees_close(loop_batch, scan_batch, rtol=0)
  np.testing.assert_allclose(loop_loss, scan_loss, rtol=1e-5)
  assert_trees_close({**loop_grads, 'blocks': stack(loop_grads['blocks'])},
                     scan_grads, rtol=1e-4, atol=1e-6)


def residual_bytes(loss_fn, args):
  """What JAX itself lists (``jax.ad_checkpoint.print_saved_residuals``)."""
  return jax_residual_bytes(loss_fn, *args)


def checkpoint_eqns(jaxpr):
  """The ``checkpoint`` equations of `jaxpr`, those in sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'checkpoint':
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        sub = getattr(sub, 'jaxpr', sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, 'eqns'):
          yield from checkpoint_eqns(sub)


@pytest.mark.parametrize('case', CASES)
def test_policy_reaches_every_block(case):
  policy = POLICIES[f'names_{case}']
  loss_fn, args = small(case, policy=policy)
  eqns = list(checkpoint_eqns(jax.make_jaxpr(loss_fn)(*args).jaxpr))
  scanned = case in ('mlp', 'transformer_scan')
  depth = SMALL[case].get('num_layers', SMALL[case].get('num_blocks'))
  # Under scan one checkpoint, the body, runs for every layer.
  assert len(eqns) == (1 if scanned else depth)
  for eqn in eqns:
    assert eqn.params['policy'] is policy
    assert eqn.params['prevent_cse'] == (not scanned)


def mlp_residual_bytes(policy):
  return residual_bytes(*examples.mlp(**SMALL['mlp'], policy=policy))


def test_mlp_named_policies_save_between_nothing_and_everything():
  nothing = mlp_residual_bytes(policies.nothing_saveable)
  everything = mlp_residual_bytes(policies.everything_saveable)
  pre = mlp_residual_bytes(policies.save_only_these_names('pre_activation'))
  out = mlp_residual_bytes(policies.save_only_these_names('layer_output'))
  # From JAX 0.11 tanh's derivative keeps 1 - tanh**2, one stack like the
  # pre-activations: saving everything can cost what saving those does.
  assert nothing < pre <= everything
  assert nothing <= out <= everything
  sizes = SMALL['mlp']
  stack = sizes['num_layers'] * sizes['batch'] * sizes['width'] * 4
  biases = sizes['num_layers'] * sizes['width'] * 4
  # Saved pre-activations cost one (layers, batch, width) stack, and the
  # backward pass then needs the biases no more.
  assert pre - nothing == stack - biases
  # Saving 'layer_output' saves nothing more: tanh's derivative reads tanh's
  # own result, not its named copy, and the copy's other reader, the next
  # layer, is outside the block, where it is already saved as an input.
  assert out == nothing


@pytest.mark.parametrize('name', ['pre_activation', 'layer_output'])
def test_mlp_residuals_match_jax_checkpoint(monkeypatch, name):
  ours = mlp_residual_bytes(policies.save_only_these_names(name))
  monkeypatch.setattr(examples, 'checkpoint', jax.checkpoint)
  theirs = mlp_residual_bytes(
      jax.checkpoint_policies.save_only_these_names(name))
  assert ours == theirs


def test_unknown_model_names_the_available_ones():
  with pytest.raises(ValueError, match='transformer') as info:
    examples.build('nope')
  assert 'mlp' in str(info.value) and 'convnet' in str(info.value)


def test_unknown_size_keyword_is_a_type_error():
  with pytest.raises(TypeError, match='depth'):
    examples.build('mlp', depth=3)


def test_transformer_rejects_indivisible_heads():
  with pytest.raises(ValueError, match='num_heads'):
    examples.transformer(d_model=10, num_heads=3)


def test_every_model_of_the_registry_builds_by_name():
  for name in examples.MODELS:
    loss_fn, args = examples.build(name, **SMALL[name])
    assert np.isfinite(float(loss_fn(*args)))
  assert set(examples.MODELS) == {name.removesuffix('_scan') for name in SMALL}


def test_default_sizes_compile():
  """Each model at its default size compiles to a gradient step that
  reads every array it is given (``jit`` drops arguments a program does
  not use) and returns a gradient shaped as the parameters."""
  for name in examples.MODELS:
    loss_fn, args = examples.build(name)
    compiled = jax.jit(jax.grad(loss_fn)).lower(*args).compile()
    given = sum(x.nbytes for x in jax.tree_util.tree_leaves(args))
    assert compiled.memory_analysis().argument_size_in_bytes == given, name
    shape = lambda x: (x.shape, x.dtype)
    assert (jax.tree_util.tree_map(shape, compiled.out_info)
            == jax.tree_util.tree_map(shape, args[0])), name


# Sizes no other test builds, so that no compile of an earlier test's,
# cached, could hide one here.
UNSHARED = {
    'mlp': dict(num_layers=3, width=24, batch=5),
    'transformer': dict(num_layers=2, d_model=24, num_heads=2, seq_len=9, batch=3),
    'transformer_scan': dict(num_layers=2, d_model=24, num_heads=2, seq_len=9, batch=3,
                             use_scan=True),
    'convnet': dict(num_blocks=2, channels=5, image_size=9, batch=3, num_classes=4),
}


def test_drawing_the_arguments_compiles_nothing():
  """The arguments are drawn on the host and transferred: building every
  model, and the sharded transformer on a one-device mesh, starts no XLA
  compile (a ``jax.random`` draw compiles one per model, ``jnp.asarray``
  one per shape), and the abstract arguments are the drawn ones' shapes
  and dtypes."""
  build = lambda case, **kw: examples.build(case.removesuffix('_scan'), **UNSHARED[case], **kw)
  with xla_compiles() as compiles:
    built = {case: build(case, seed=5)[1] for case in CASES}
    mesh = examples.data_model_mesh(1, 1)
    _, sharded = examples.sharded_transformer(mesh, **UNSHARED['transformer'], seed=5)
  assert compiles == []
  shape = lambda x: (x.shape, x.dtype)
  for case, args in built.items():
    _, abstract = build(case, seed=5, abstract=True)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(abstract))
    assert jax.tree_util.tree_map(shape, abstract) == jax.tree_util.tree_map(shape, args), case
  # The sharded transformer holds the unsharded one's numbers.
  assert_trees_close(sharded, built['transformer'], rtol=0)
