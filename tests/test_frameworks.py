"""The explorer on models as Flax Linen, Flax NNX, Equinox and Haiku users
write them: residuals found at the lines of the model's code, with the names and
module paths it gave them, blocks named after the user's code, and the
program's own policy ("as written") measuring what JAX and XLA measure for
the unmodified model."""

import re

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
    # The block is a lambda calling the module: named after the module.
    'haiku': ('HkBlock', 'block', {'query', 'mlp_hidden'},
              {'query': 'block', 'mlp_hidden': 'block'}),
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
  table = residual_table_html(report).replace('<wbr>', '')  # break points
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


def _parameter_modules(args) -> set[str]:
  """Every module path the parameters name, from their pytree paths alone
  (a leaf's path without its key, Linen's collection and value wrappers;
  Haiku's keys are module paths, less the module ``hk.layer_stack`` adds),
  with each path's parents and the root ''."""
  modules = {''}
  for path, _ in jax.tree_util.tree_flatten_with_path(args[0])[0]:
    keys = [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path]
    while keys and keys[-1] in ('value', 'raw_value'):
      keys.pop()
    keys = keys[1:] if keys and keys[0] == 'params' else keys
    keys = [m for k in keys[:-1] for m in k.split('/')
            if m != '__layer_stack_no_per_layer'] + keys[-1:]
    for n in range(len(keys)):
      modules.add('/'.join(keys[:n]))
  return modules


def _check_module_paths(loss_fn, args):
  from remat_explorer.analysis import compile_costs, live_at_peak, split_graph_of
  report, costs = analyze(loss_fn, *args), compile_costs(loss_fn, *args)
  modules = _parameter_modules(args)
  graph = split_graph_of(report)
  named = {
      'residual': {r.module_path for r in report.residuals},
      'block': {b.module_path for b in report.blocks},
      'diagram node': {n.module_path for n in graph.nodes},
      'diagram group': {t for n in graph.nodes for t in n.group_titles if '/' in t},
      'peak buffer': {b.module_path for b in live_at_peak(report, costs)},
      'to_dict': {r['module_path'] for r in report.to_dict()['residuals']},
  }
  for view, paths in named.items():
    assert paths <= modules, (view, sorted(paths - modules))
  assert len(named['peak buffer'] - {''}) >= 3, named['peak buffer']


def test_every_view_names_a_module_as_its_parameters_do(model):
  """One module path per module: the residuals, the diagram's blocks and
  groups, and every buffer at the compiled peak (residual or not) use the
  parameters' own paths, never a name stack's root class (Linen's
  ``LinenModel/...``) or a library class (Equinox's ``eqx.nn.Linear``)."""
  _, loss_fn, args = model
  _check_module_paths(loss_fn, args)


def test_linen_variables_name_modules_as_their_params_do():
  """Linen's parameters given as the whole ``{'params': ...}`` variables:
  modules are named as with the ``params`` alone (``blocks/qkv``, not
  ``params/blocks/qkv``), in every view."""
  loss_fn, (params, tokens) = framework_models.linen_transformer()
  _check_module_paths(lambda variables, tokens: loss_fn(variables['params'], tokens),
                      ({'params': params}, tokens))


def test_flax_remat_scan_blocks_are_named_by_the_users_module():
  """``nn.remat_scan`` remats a Flax function that only runs a scan over
  the user's block: the block is named after that block and its module
  path is the stack's, as for ``nn.scan(nn.remat(Block))``, and its
  figures are XLA's for the model as written."""
  loss_fn, args = framework_models.linen_remat_scan()
  report = analyze(loss_fn, *args)
  (block,) = report.blocks
  assert (block.name, block.module_path, block.trip_count) == ('LinenMlpBlock', 'stack', 2)
  computed = [r for r in report.residuals if r.kind == 'equation' and r.site]
  assert {r.module_path for r in computed if r.site.function == 'LinenMlpBlock.__call__'} \
      >= {'stack/up', 'stack/down'}
  assert all(r.site.file == MODEL_FILE for r in computed)
  from remat_explorer.analysis import compile_costs
  compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(*args).compile()
  assert compile_costs(loss_fn, *args).temp_bytes == compiled.memory_analysis().temp_size_in_bytes


def test_unrolled_linen_blocks_are_at_their_modules_paths():
  """Linen names a module in the name stack only: each ``nn.remat``ed
  block of an unrolled stack is at its own module's path, the path its
  residuals carry."""
  loss_fn, args = framework_models.linen_unrolled()
  report = analyze(loss_fn, *args)
  paths = [b.module_path for b in report.blocks]
  assert paths == ['block0', 'block1', 'block2']
  saved = {r.module_path for r in report.residuals
           if r.kind == 'equation' and r.module_path.startswith('block')}
  assert saved and saved <= set(paths)


def test_layers_of_one_loop_are_each_at_their_own_modules_path():
  """Layers a loop runs (``for layer in self.layers``), made in ``setup``
  and named by their index, as Hugging Face's Flax models do: every
  layer's equations come from the same lines, which alone say only the
  path the layers share (``encoder``). Each block, each residual it saves
  and each buffer at the compiled peak is at its own layer's path
  (``encoder/0``...), and a peak buffer of the backward pass names its
  module once (not ``encoder/LinenLayerListModel/encoder/0``) and without
  the spec ``jnp.einsum`` adds to the name stack."""
  from remat_explorer.analysis import compile_costs, live_at_peak
  loss_fn, args = framework_models.linen_layer_list()
  report = analyze(loss_fn, *args)
  assert [b.module_path for b in report.blocks] == ['encoder/0', 'encoder/1', 'encoder/2']
  saved = {r.module_path.split('/')[1] for r in report.residuals
           if r.kind == 'equation' and r.module_path.startswith('encoder/')}
  assert saved == {'0', '1'}, saved  # the last layer's output is the loss's
  live = live_at_peak(report, compile_costs(loss_fn, *args))
  recomputed = {b.module_path for b in live if b.made_by == 'recompute'}
  assert recomputed and all(re.fullmatch(r'encoder/\d(/\w+)?', p) for p in recomputed), recomputed
  _check_module_paths(loss_fn, args)


def test_haiku_library_modules_remated_in_a_lambda():
  """``hk.remat(lambda x: hk.nets.MLP(...)(x))``: each block is named
  after the module the lambda calls, and every view names a module as
  Haiku's name stack does (``mlp/linear_0``; its parameters say
  ``mlp/~/linear_0``)."""
  from remat_explorer.analysis import compile_costs, live_at_peak
  loss_fn, args = framework_models.haiku_mlps()
  assert 'mlp/~/linear_0' in args[0]
  report = analyze(loss_fn, *args)
  assert [(b.name, b.module_path) for b in report.blocks] == [('MLP', 'mlp'), ('MLP#2', 'mlp_1')]
  modules = {'', 'mlp', 'mlp_1', 'mlp/linear_0', 'mlp/linear_1', 'mlp_1/linear_0',
             'mlp_1/linear_1'}
  saved = {r.module_path for r in report.residuals}
  at_peak = {b.module_path for b in live_at_peak(report, compile_costs(loss_fn, *args))}
  assert {'mlp/linear_0', 'mlp_1/linear_0'} <= saved <= modules
  assert at_peak <= modules and len(at_peak - {''}) >= 2
