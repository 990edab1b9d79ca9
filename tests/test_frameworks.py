"""The explorer on models as Flax Linen, Flax NNX and Equinox users write
them: residuals found at the lines of the model's code, with the names and
module paths it gave them, blocks named after the user's code, and the
program's own policy ("as written") measuring what JAX and XLA measure for
the unmodified model."""

import equinox as eqx
import jax
import jax.ad_checkpoint
import pytest

from remat_explorer.analysis import analyze, compare
from remat_explorer.viz.html.tables import residual_table_html
from tests import framework_models
from tests.parity import printed_residuals

MODEL_FILE = 'tests/framework_models.py'

EXPECTED = {
    # model: (block name, block module path, names, {name: module path})
    'linen': ('LinenBlock', 'blocks', {'qkv', 'mlp_hidden'}, {'qkv': 'blocks'}),
    'nnx': ('run', 'blocks', {'query', 'mlp_hidden'},
            {'query': 'blocks/attention', 'mlp_hidden': 'blocks'}),
    'equinox': ('layer_step', 'layers', {'mlp_hidden'}, {'mlp_hidden': 'layers'}),
}


@pytest.fixture(scope='module', params=sorted(framework_models.MODELS))
def model(request):
  loss_fn, args = framework_models.MODELS[request.param]()
  return request.param, loss_fn, args


def test_residuals_are_found_at_the_models_own_lines(model):
  name, loss_fn, args = model
  report = analyze(loss_fn, *args)
  computed = [r for r in report.residuals if r.kind == 'equation']
  at_model = sum(r.bytes for r in computed if r.site and r.site.file == MODEL_FILE)
  assert at_model >= 0.9 * sum(r.bytes for r in computed), [
      (r.type_string, r.source) for r in computed]
  block_name, block_path, names, paths = EXPECTED[name]
  (block,) = report.blocks
  assert (block.name, block.module_path, block.trip_count) == (block_name, block_path, 3)
  assert block.source.startswith(MODEL_FILE)
  # The names the model gave, carried out of the scan that stacks them.
  named = {r.name: r for r in report.residuals if r.name}
  assert set(named) == names
  for value, path in paths.items():
    assert named[value].module_path == path
    assert named[value].carried_out_of == ('scan×3',)
  table = residual_table_html(report)
  assert all(f'>{n}<' in table for n in names)


def _as_jax_takes_it(loss_fn, args):
  """JAX differentiates arrays only: an Equinox model's other leaves are
  held aside, as ``eqx.filter_value_and_grad`` does."""
  model, tokens = args
  arrays, static = eqx.partition(model, eqx.is_array)
  if not jax.tree_util.tree_leaves(static):
    return loss_fn, args

  def on_arrays(model, tokens):
    return loss_fn(eqx.combine(model, static), tokens)
  return on_arrays, (arrays, tokens)


def test_as_written_is_what_jax_and_xla_measure_for_the_unmodified_model(model):
  name, loss_fn, args = model
  comparison = compare(loss_fn, *args, policies={}, include_no_remat=False)
  (row,) = comparison.rows
  assert row.label == 'as written' and row.policy is None
  ours = [f'{r.type_string.replace("float32", "f32").replace("int32", "i32")} '
          f'{r.description}' for r in row.report.residuals]
  jax_loss, jax_args = _as_jax_takes_it(loss_fn, args)
  assert ours == printed_residuals(jax.ad_checkpoint.print_saved_residuals,
                                   jax_loss, *jax_args)
  compiled = jax.jit(jax.value_and_grad(jax_loss)).lower(*jax_args).compile()
  assert row.temp_bytes == compiled.memory_analysis().temp_size_in_bytes
  assert row.report.blocks[0].policy.startswith('save_only_these_names(')
