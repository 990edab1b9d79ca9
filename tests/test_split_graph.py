"""The split diagram: what its DOT source and SVG say about the split.

Each test reads the diagram for facts the analysis also states (residual
counts and bytes, recomputed equations, names, blocks) and checks that the
two agree, on small programs and on a 5,000-equation one.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import remat_explorer as rx
from remat_explorer import examples, viz
from remat_explorer.analysis import analyze, describe_policy
from remat_explorer.viz.diagram import _summarize
from remat_explorer.analysis.split.graph import split_graph_of
from remat_explorer.viz.diagram.split_graph import RECOMPUTED_FILL, split_diagram
from remat_explorer.viz.text import format_bytes

cp = rx.checkpoint_policies


def _normal(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape)


def _named_block():
  def block(x, w):
    h = rx.checkpoint_name(jnp.sin(x @ w), 'hidden')
    y, _ = jax.lax.scan(lambda c, _: (jnp.cos(c) @ w, None), h, None, length=3)
    return jnp.sum(jnp.tanh(y))
  return block, (_normal(0, (4, 8)), _normal(1, (8, 8)))


def _residual_edges(source: str) -> list[str]:
  return [line for line in source.splitlines() if 'class=residual' in line]


def _drawn(diagram):
  return [n for s in diagram.sections() for n in s.nodes.values()]


@pytest.mark.parametrize('policy', [cp.nothing_saveable, cp.dots_saveable,
                                    cp.everything_saveable,
                                    cp.save_only_these_names('hidden')],
                         ids=describe_policy)
def test_residual_edges_carry_every_residual_with_its_bytes(policy):
  block, args = _named_block()
  report = analyze(rx.checkpoint(block, policy=policy), *args)
  (b,) = report.blocks
  diagram = split_diagram(report, expand='all')
  residual_edges = [e for e in diagram.edges if e.kind == 'residual']
  assert sum(e.count for e in residual_edges) == len(b.residuals) >= 1
  assert sum(e.bytes for e in residual_edges) == b.residual_bytes
  # Every residual edge goes from the forward cluster to the backward one,
  # and each value the forward pass computed and saved has its own node.
  for e in residual_edges:
    assert e.src.startswith('f0') and e.dst.startswith('b0')
  computed = [r for r in b.residuals if r.kind == 'equation']
  assert len([e for e in residual_edges if e.count == 1 and not e.dst.endswith('saved')]) \
      >= len(computed)
  source = viz.split_graph(report).source
  assert len(_residual_edges(source)) == len(split_diagram(report).edges and [
      e for e in split_diagram(report).edges if e.kind == 'residual'])


def test_two_clusters_block_subclusters_and_a_legend():
  loss_fn, args = examples.transformer(num_layers=2, d_model=16, seq_len=8, batch=2)
  report = analyze(loss_fn, *args)
  source = viz.split_graph(report, block=report.blocks[1].name).source
  assert 'subgraph cluster_forward' in source and 'subgraph cluster_backward' in source
  assert 'subgraph cluster_f0 ' in source and 'subgraph cluster_b0 ' in source
  assert 'subgraph cluster_legend' in source
  # The forward cluster holds only forward nodes, the backward only backward.
  forward, backward = source.split('subgraph cluster_backward')
  backward = backward.split('subgraph cluster_legend')[0]
  assert not re.search(r'^\s*"?b\d+[_/]\S* \[', forward, re.M)
  assert not re.search(r'^\s*"?f\d+[_/]\S* \[label', backward, re.M)


def test_groups_are_the_users_modules_and_open_one_level_at_a_time():
  from tests.framework_models import nnx_transformer
  report = analyze(*_as_call(nnx_transformer()))
  closed = split_diagram(report)
  groups = {n.id: n for n in _drawn(closed) if n.kind == 'group'}
  assert {'f0/attention', 'f0/norm1', 'f0/norm2', 'f0/mlp_in', 'f0/mlp_out'} <= set(groups)
  attention = groups['f0/attention']
  assert attention.lines[0] == 'blocks/attention' and attention.opens  # its module path
  assert 'saves 1 residual' in attention.lines[-1]
  assert attention.names == ['attention_probs', 'query']  # named inside; query saved
  assert any('tests/framework_models.py' in d for d in attention.details)
  # Opened, the attention group shows its modules, then primitives.
  opened = split_diagram(report, expand={'f0/attention'})
  inside = {n.id for s in opened.sections() if s.id == 'f0/attention' for n in s.nodes.values()}
  assert {'f0/attention/query', 'f0/attention/key', 'f0/attention/value'} <= inside
  deeper = split_diagram(report, expand={'f0/attention', 'f0/attention/query'})
  query = next(s for s in deeper.sections() if s.id == 'f0/attention/query')
  assert 'dot_general' in [n.lines[0] for n in query.nodes.values()]
  # Closed or open, the drawing accounts for every equation of the split.
  record = [n for n in split_graph_of(report).nodes if n.parent is None and n.kind in ('eqn', 'call')]
  total = sum(n.equations for n in record)
  for diagram in (closed, opened, deeper, split_diagram(report, expand='all')):
    assert sum(n.equations for n in _drawn(diagram)) == total
  # Compact closed: the modules are boxes; the block's own code (its adds,
  # the gelu it calls) and the values saved outside the blocks are nodes.
  assert closed.num_nodes() < 70


def _as_call(example):
  loss_fn, args = example
  return (loss_fn, *args)


def test_recomputed_equations_are_coloured_and_counted():
  block, args = _named_block()
  report = analyze(rx.checkpoint(block, policy=cp.save_only_these_names('hidden')), *args)
  (b,) = report.blocks
  source = viz.split_graph(report, expand='all').source
  recomputed_nodes = re.findall(r'^\s*(b0_e\d+) \[.*class="eqn recomputed', source, re.M)
  # The nodes are the staged half's own equations; those recomputed inside
  # its scan (which also reads cotangents) count in the FLOPs, not as nodes.
  top_level = [e.index for e in b.recomputed if e.index is not None]
  inside_scan = [e for e in b.recomputed if e.index is None]
  assert [int(n.split('_e')[1]) for n in recomputed_nodes] == top_level
  assert len(recomputed_nodes) >= 1 and inside_scan
  assert all(b.staged_jaxpr.eqns[e.inside].primitive.name == 'scan' for e in inside_scan)
  assert f'recomputes {len(b.recomputed)} eqns' in source  # inside its scan too
  assert RECOMPUTED_FILL in source
  # Saving everything recomputes nothing.
  everything = analyze(rx.checkpoint(block, policy=cp.everything_saveable), *args)
  assert 'recomputed' not in viz.split_graph(everything, expand='all').source.split(
      'cluster_legend')[0].replace('recomputes 0 eqns', '')


def _label_opening(*lines: str) -> str:
  """A pattern for a node's label that opens with `lines` (patterns), one
  line per row of the label's table."""
  return r'<<table [^>]*>' + ''.join(rf'<tr><td>{line}' + (r'</td></tr>' if i + 1 < len(lines)
                                                           else '')
                                     for i, line in enumerate(lines))


def test_checkpoint_names_on_nodes_and_residual_edges():
  block, args = _named_block()
  report = analyze(rx.checkpoint(block, policy=cp.save_only_these_names('hidden')), *args)
  source = viz.split_graph(report, expand='all').source
  # The name is drawn on the equation that made the value, not as a node.
  assert re.search(_label_opening('sin', '<b>“hidden”</b>') + '.*class="eqn named"', source)
  assert re.search(_label_opening('sin'), source)
  assert not re.search(_label_opening('name'), source)
  (named_edge,) = [e for e in _residual_edges(source) if 'hidden' in e]
  (saved,) = [r for r in report.residuals if r.name == 'hidden']
  assert f'hidden · {format_bytes(saved.bytes)}' in named_edge
  # The saved value's node on the backward side is named too.
  assert re.search(_label_opening('residual', '<b>“hidden”</b>'), source)


def test_calls_collapse_with_a_summary_and_expand_on_request():
  block, args = _named_block()
  report = analyze(rx.checkpoint(block, policy=cp.nothing_saveable), *args)
  source = viz.split_graph(report).source
  scan_nodes = re.findall(r'^\s*(b0_e\d+) \[label=' + _label_opening(
      'scan ×3', r'<font point-size="9">(\d+) eqns'), source, re.M)
  assert len(scan_nodes) == 1
  node_id, count = scan_nodes[0]
  assert int(count) >= 2 and 'class="sub' in source
  assert f'subgraph cluster_{node_id}_body' not in source
  opened = viz.split_graph(report, expand=[node_id]).source
  assert f'subgraph cluster_{node_id}_body' in opened
  body = opened.split(f'subgraph cluster_{node_id}_body')[1].split('\n\t\t\t}')[0]
  assert len(re.findall(rf'{node_id}_j0_e\d+ \[', body)) == int(count)


def test_one_block_at_a_time_and_clear_errors_for_other_names():
  loss_fn, args = examples.transformer(num_layers=2, d_model=16, seq_len=8, batch=2)
  report = analyze(loss_fn, *args)
  first = report.blocks[0].name
  source = viz.split_graph(report, block=first).source
  assert 'cluster_f0 ' in source and 'cluster_f1 ' not in source
  with pytest.raises(ValueError, match="no block named 'nope'"):
    viz.split_graph(report, block='nope')


def test_identical_blocks_are_drawn_once_with_their_count():
  loss_fn, args = examples.transformer(num_layers=6, d_model=16, seq_len=8, batch=2)
  report = analyze(loss_fn, *args)
  source = viz.split_graph(report, max_nodes=100).source
  assert '×6 alike blocks' in source
  assert 'cluster_f1 ' not in source


def _long_program(num_layers):
  """An unrolled MLP of `num_layers` layers in one block: thousands of
  equations, with a name every tenth layer."""
  def mlp(ws, x):
    for i, w in enumerate(ws):
      x = jnp.tanh(x @ w + 0.1)
      if i % 10 == 0:
        x = rx.checkpoint_name(x, f'layer{i}')
    return jnp.sum(x)
  ws = [_normal(i, (8, 8)) * 0.3 for i in range(num_layers)]
  return rx.checkpoint(mlp, policy=cp.dots_saveable), (ws, _normal(-1, (4, 8)))


@pytest.fixture(scope='module')
def long_report():
  """At least 5,000 equations: JAX versions trace a layer to different
  numbers of them (JAX 0.11 to fewer than 0.10), so the layers grow to it."""
  num_layers = 400
  while True:
    f, args = _long_program(num_layers)
    report = analyze(f, *args)
    (block,) = report.blocks
    count = len(block.known_jaxpr.eqns) + len(block.staged_jaxpr.eqns)
    if count >= 5000:
      return report
    num_layers = num_layers * 5000 // count + 10


def test_a_5000_equation_program_is_summarized_and_renders(long_report):
  # How long this takes is bench/viz.py's to measure, not a test's to assert.
  digraph = viz.split_graph(long_report, max_nodes=300)
  svg = viz.to_svg(digraph)
  nodes = re.findall(r'^\s*"?([fb]0[_/][^ "]+)"? \[', digraph.source, re.M)
  assert len(nodes) <= 300
  assert 'summarized:' in digraph.source
  # Unrolled layers are folded into repeated runs, not just cut away.
  assert re.search(r'dot_general[^<]* ×\d+', digraph.source)
  assert len(svg) < 2_000_000
  assert '<svg' in svg and 'cluster_forward' in svg


def test_folded_runs_keep_the_equation_count_and_names(long_report):
  digraph_source = viz.split_graph(long_report, max_nodes=300).source
  (block,) = long_report.blocks
  drawn = split_diagram(long_report, max_nodes=300)
  eqns_drawn = sum(n.equations for n in _drawn(drawn))
  assert eqns_drawn == len(block.known_jaxpr.eqns) + len(block.staged_jaxpr.eqns)
  assert 'names: layer0, layer10' in digraph_source


def test_periodic_runs_find_repeated_layers():
  seq = list('xy') + list('abc') * 5 + list('z')
  assert _summarize._periodic_runs(seq, 3, 8) == [(2, 3, 5)]
  assert _summarize._periodic_runs(list('abcd'), 3, 8) == []
  # Two different runs, each repeated, are both found.
  assert _summarize._periodic_runs(list('ab' * 4 + 'c' * 6), 3, 4) == [(0, 2, 4), (8, 1, 6)]


def test_without_dot_the_error_says_how_to_install_and_dot_source_remains(monkeypatch):
  block, args = _named_block()
  report = analyze(rx.checkpoint(block), *args)
  digraph = viz.split_graph(report)
  monkeypatch.setenv('PATH', '/nonexistent')
  with pytest.raises(RuntimeError, match='apt-get install graphviz') as e:
    viz.to_svg(digraph)
  assert 'digraph.source' in str(e.value)
  assert 'cluster_forward' in digraph.source
  # The static view shows the message and the DOT text instead of failing.
  html = viz.StaticView(report)._repr_html_()
  assert 'apt-get install graphviz' in html and 'cluster_forward' in html


def test_expand_takes_one_id_as_a_string_and_refuses_unknown_ones():
  report = analyze(*_as_call(examples.transformer(num_layers=1, d_model=16, seq_len=8,
                                                  batch=2)))
  closed = split_diagram(report)
  openable = sorted(n.id for n in _drawn(closed) if n.opens)
  assert openable
  one = openable[0]
  as_string, as_set = split_diagram(report, expand=one), split_diagram(report, expand={one})
  assert as_string.num_nodes() == as_set.num_nodes() != closed.num_nodes()
  with pytest.raises(ValueError, match=r"expand= names \['attention'\], which no group or "
                                       r"call of this split has; those that open here: "
                                       + re.escape(repr(openable[:20])[:-1])):
    split_diagram(report, expand='attention')


# -- grouping on Flax Linen, Flax NNX and Equinox models -------------------------------

def _model_module_paths(params) -> set[str]:
  """Every module path of a model, read from its own parameters tree: each
  array's path without its own name (and NNX's ``.value``), and every
  prefix of it."""
  found = set()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if not isinstance(leaf, jax.Array):
      continue
    keys = [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', '')))) for k in path]
    if keys[-1] == 'value':
      keys.pop()
    keys.pop()
    found.update('/'.join(keys[:n]) for n in range(1, len(keys) + 1))
  return found


@pytest.fixture(scope='module', params=['linen', 'nnx', 'equinox'])
def framework_report(request):
  from tests.framework_models import MODELS
  loss_fn, args = MODELS[request.param](batch=2, seq=8)
  return analyze(loss_fn, *args), _model_module_paths(args[0])


def test_every_module_of_the_model_is_one_group_titled_by_its_module_path(framework_report):
  report, paths = framework_report
  (block,) = report.blocks
  below = {p for p in paths if p.startswith(block.module_path + '/')}
  assert len(below) >= 6  # norms, attention and its projections, the MLP
  opened = split_diagram(report, expand='all')
  for side in ('f0', 'b0'):
    (top,) = [s for s in opened.sections() if s.id == side]
    titles = [s.title for s in top.walk() if s is not top and '_body' not in s.id]
    # Each module once, as its full path, whatever the framework.
    assert sorted(t for t in titles if t in below) == sorted(below), side
  # No equation of a module below the block is left out of its group: a
  # norm is one box, not its primitives.
  graph = split_graph_of(report)
  for n in graph.nodes:
    if n.block == 0 and n.kind in ('eqn', 'call') and n.module_path in below:
      assert n.group_titles and n.module_path in n.group_titles, (n.id, n.label)
  # Closed, the block shows its modules' boxes at the top, beside the
  # library functions the block's own code calls (one box each, not their
  # primitives).
  closed = split_diagram(report)
  for side in ('f0', 'b0'):
    (section,) = [s for s in closed.sections() if s.id == side]
    tops = [n.lines[0] for n in section.nodes.values() if n.kind == 'group']
    assert tops and set(tops) & below, tops
    assert all(_is_library_function(t) for t in set(tops) - below), tops


def test_checkpoint_names_are_drawn_on_the_values_they_name(framework_report):
  report, _ = framework_report
  graph = split_graph_of(report)
  assert all(n.label != 'name' for n in graph.nodes if n.kind == 'eqn')
  (block,) = report.blocks
  names = {n for e in block.known_jaxpr.eqns
           if e.primitive.name == 'name' for n in [e.params['name']]}
  assert names
  named = {n.name: n for n in graph.nodes if n.side == 'forward' and n.kind == 'eqn' and n.name}
  assert names <= set(named)
  for name in names:
    # The node carries the name and stands for the naming equation too.
    assert named[name].equations >= 2 and named[name].label not in ('name', 'reduce_precision')
  source = viz.split_graph(report, expand='all').source
  assert re.search(_label_opening('dot_general'), source)
  assert not re.search(_label_opening('(name|reduce_precision)'), source)


def test_outside_the_blocks_groups_are_the_users_modules_and_functions(framework_report):
  report, paths = framework_report
  graph = split_graph_of(report)
  (outside,) = [b for b in graph.blocks if b.outside]
  producers = [n for n in graph.nodes if n.block == outside.index and n.kind == 'eqn']
  assert producers
  for n in producers:
    # A module of the model, or the user's own function (the loss).
    top = n.group_titles[0]
    assert top in paths or (n.site is not None and n.site.function.endswith(top)), top


def _head_outside_blocks():
  """Two checkpointed layers and a head that is not: the head's matmul
  output is saved (the backward pass of its square reads it)."""
  def layer(x, w):
    return jnp.tanh(x @ w)

  def loss_fn(params, x):
    for w in params['layers']:
      x = rx.checkpoint(layer, policy=cp.nothing_saveable)(x, w)
    logits = x @ params['head']
    return jnp.sum(logits * logits)
  params = {'layers': [_normal(1, (8, 8)), _normal(2, (8, 8))], 'head': _normal(3, (8, 24))}
  return loss_fn, (params, _normal(4, (4, 8)))


def test_residuals_saved_outside_the_blocks_are_drawn_with_their_bytes():
  loss_fn, args = _head_outside_blocks()
  report = analyze(loss_fn, *args)
  (logits,) = [r for r in report.residuals if r.block is None and r.shape == (4, 24)]
  assert logits.kind == 'equation' and logits.primitive == 'dot_general'
  diagram = split_diagram(report)
  residual_edges = [e for e in diagram.edges if e.kind == 'residual']
  outside = [e for e in residual_edges if e.src.startswith('f_outside')]
  (drawn,) = [e for e in outside if e.dst == f'b_outside_r{logits.index}']
  assert drawn.bytes == logits.bytes == 4 * 24 * 4
  # Every value computed outside the blocks and saved is drawn, once, with
  # its bytes; the arguments the backward pass reads are counted in words.
  computed = [r for r in report.residuals if r.block is None and r.kind != 'argument']
  assert sum(e.count for e in outside) == len(computed)
  assert sum(e.bytes for e in outside) == sum(r.bytes for r in computed)
  arguments = [r for r in report.residuals if r.block is None and r.kind == 'argument']
  (title,) = [s.title for s in diagram.sections() if s.id == 'f_outside']
  assert f'reads {len(arguments)} argument' in title
  # With the blocks' own (the two layers are alike: drawn once), the
  # drawing accounts for every byte the analysis says is saved.
  (block_drawn,) = [b for b in split_graph_of(report).blocks if not b.outside]
  per_block = sum(e.bytes for e in residual_edges if e.src.startswith('f0'))
  assert per_block == block_drawn.residual_bytes
  assert per_block * len(block_drawn.alike) + sum(e.bytes for e in outside) == sum(
      b.residual_bytes for b in report.blocks) + sum(r.bytes for r in computed)
  # Its producer shows where it was computed; opened, the equation is there.
  producer = split_diagram(report, expand='all')
  node = next(n for s in producer.sections() for n in s.nodes.values()
              if n.id == f'f_outside_r{logits.index}')
  assert node.lines[0] == 'dot_general' and any('test_split_graph.py' in d
                                                for d in node.details)
  source = viz.split_graph(report).source
  assert 'outside remat blocks' in source
  assert re.search(rf'f_outside[^ ]* -> b_outside_r{logits.index} \[[^]]*'
                   rf'{re.escape(format_bytes(logits.bytes))}', source)


def test_the_examples_top_groups_are_their_own_functions():
  report = analyze(*_as_call(examples.transformer(num_layers=1, d_model=16, seq_len=8,
                                                  batch=2)))
  closed = split_diagram(report)
  for side in ('f0', 'b0'):
    (section,) = [s for s in closed.sections() if s.id == side]
    tops = [n.lines[0].split(' @')[0] for n in section.nodes.values() if n.kind == 'group']
    # Functions of the example's own code, and the library functions the
    # block calls itself (gelu), one box each.
    assert tops and any(callable(getattr(examples, t, None)) for t in tops), tops
    assert all(callable(getattr(examples, t, None)) or _is_library_function(t)
               for t in tops), tops
  graph = split_graph_of(report)
  assert any(n.group[-1:] == ('softmax',) and len(n.group) > 1 for n in graph.nodes)


def _unit_rms(x):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _parameterless_norm_model(framework):
  """A checkpointed block of a norm without parameters (the user's own
  ``RMSNorm`` class) between two linear layers, as each framework writes
  it."""
  x = _normal(5, (4, 8))
  if framework == 'linen':
    from flax import linen as nn

    class RMSNorm(nn.Module):
      def __call__(self, x):
        return _unit_rms(x)

    class Block(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(8, name='proj_out')(RMSNorm(name='norm')(nn.Dense(8, name='proj_in')(x)))

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.remat(Block)(name='block')(x)
    model = Model()
    params = model.init(jax.random.key(0), x)['params']
    return lambda p, x: jnp.sum(model.apply({'params': p}, x) ** 2), (params, x)
  if framework == 'nnx':
    from flax import nnx

    class RMSNorm(nnx.Module):
      def __call__(self, x):
        return _unit_rms(x)

    class Block(nnx.Module):
      def __init__(self, rngs):
        self.proj_in, self.norm = nnx.Linear(8, 8, rngs=rngs), RMSNorm()
        self.proj_out = nnx.Linear(8, 8, rngs=rngs)

      def __call__(self, x):
        return self.proj_out(self.norm(self.proj_in(x)))
    graphdef, state = nnx.split(Block(nnx.Rngs(0)))
    run = nnx.remat(lambda block, x: block(x))
    return (lambda s, x: jnp.sum(run(nnx.merge(graphdef, s), x) ** 2)), (state, x)
  import equinox as eqx

  class RMSNorm(eqx.Module):
    def __call__(self, x):
      return _unit_rms(x)

  class Block(eqx.Module):
    proj_in: eqx.nn.Linear
    norm: RMSNorm
    proj_out: eqx.nn.Linear

    def __call__(self, x):
      return jax.vmap(self.proj_out)(self.norm(jax.vmap(self.proj_in)(x)))
  block = Block(eqx.nn.Linear(8, 8, key=jax.random.key(0)), RMSNorm(),
                eqx.nn.Linear(8, 8, key=jax.random.key(1)))
  run = eqx.filter_checkpoint(lambda block, x: block(x))
  return (lambda b, x: jnp.sum(run(b, x) ** 2)), (block, x)


@pytest.mark.parametrize('framework', ['linen', 'nnx', 'equinox'])
def test_a_module_without_parameters_is_one_group(framework):
  loss_fn, args = _parameterless_norm_model(framework)
  report = analyze(loss_fn, *args)
  closed = split_diagram(report)
  graph = split_graph_of(report)
  for side in ('f0', 'b0'):
    (section,) = [s for s in closed.sections() if s.id == side]
    groups = {n.lines[0]: n for n in section.nodes.values() if n.kind == 'group'}
    # The linear layers by their module paths; the norm by its module path
    # where the framework names it (Linen's scopes), else by its class (no
    # parameters name its path).
    prefix = report.blocks[0].module_path + '/' if report.blocks[0].module_path else ''
    norm_title = f'{prefix}norm' if framework == 'linen' else 'RMSNorm'
    assert set(groups) == {norm_title, f'{prefix}proj_in', f'{prefix}proj_out'}, groups
    norm = [n for n in graph.nodes if n.side == {'f0': 'forward', 'b0': 'backward'}[side]
            and n.group_titles[:1] == (norm_title,)]
    assert groups[norm_title].equations == sum(n.equations for n in norm)
  # Every rsqrt of the norm is inside its group (in the helper it calls):
  # none drawn at the top.
  assert all(n.group_titles[:1] == (norm_title,) for n in graph.nodes if n.label == 'rsqrt')


def test_named_scopes_are_groups_where_no_parameters_name_modules():
  def layer(x, w1, w2):
    with jax.named_scope('mlp'):
      with jax.named_scope('up'):
        h = jnp.tanh(x @ w1)
      h = jnp.einsum('bd,de->be', h, w2)
    with jax.named_scope('norm'):
      h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True))
    return h + x

  def loss_fn(ws, x):
    for w1, w2 in ws:
      x = rx.checkpoint(layer)(x, w1, w2)
    return jnp.sum(x)
  ws = [(_normal(2 * i, (8, 8)), _normal(2 * i + 1, (8, 8))) for i in range(2)]
  report = analyze(loss_fn, ws, _normal(9, (4, 8)))
  opened = split_diagram(report, expand='all')
  for side in ('f0', 'b0'):
    (top,) = [s for s in opened.sections() if s.id == side]
    titles = [s.title for s in top.walk() if s is not top]
    # Each scope once, by its path; an einsum's own scope is no group.
    assert sorted(t for t in titles if t in ('mlp', 'mlp/up', 'norm')) == ['mlp', 'mlp/up',
                                                                           'norm'], titles
    assert not any('->' in t for t in titles)
  graph = split_graph_of(report)
  assert all(n.group[:1] == ('norm',) for n in graph.nodes if n.label == 'rsqrt')


def _is_library_function(name: str) -> bool:
  """A function of JAX's numpy or nn namespaces (``gelu``, ``einsum``)."""
  import jax
  return any(callable(getattr(namespace, name, None))
             for namespace in (jax.nn, jax.numpy))
