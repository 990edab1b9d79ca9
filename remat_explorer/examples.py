"""Small, real, seeded example models for exploring remat.

Notebooks, tests, benchmarks and the HTML report need programs that look like
what people actually checkpoint: a deep MLP under ``scan``, a transformer (as
an unrolled loop or under ``scan``) and a small convnet. Each builder returns
``(loss_fn, args)``: ``loss_fn(*args)`` is a scalar float32 loss and ``args``
is ``(params, batch)``, drawn from NumPy's generator seeded with ``seed``.
Differentiate with respect to argument 0, the params::

  loss_fn, args = examples.build('transformer', num_layers=2)
  grads = jax.grad(loss_fn)(*args)

Every block goes through our ``checkpoint`` with the builder's ``policy``
(``remat=False``: no checkpoint, same math); the intermediates named with
``checkpoint_name`` are listed in ``MLP_NAMES``, ``TRANSFORMER_NAMES`` and
``CONVNET_NAMES``, for the named-value policies.

``sharded_transformer(mesh, ...)`` is the transformer with its params and
batch sharded over a 2D ``('data', 'model')`` device mesh
(``data_model_mesh``, or ``target_mesh`` for a TPU or GPU this machine does
not have); it is not in ``MODELS``, since it needs the mesh. Every builder
takes ``abstract=True`` for arguments as ``jax.ShapeDtypeStruct``s: shapes
only, nothing allocated.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from remat_explorer import checkpoint, checkpoint_name

LossFn = Callable[..., jax.Array]
Example = tuple[LossFn, tuple[Any, ...]]

MLP_NAMES = ('pre_activation', 'layer_output')
TRANSFORMER_NAMES = ('query', 'key', 'value', 'attention_logits',
                     'attention_output', 'mlp_hidden', 'mlp_output')
CONVNET_NAMES = ('conv_output',)

VOCAB_SIZE = 256


# -- shared helpers -----------------------------------------------------------

def _maybe_checkpoint(fn: Callable, *, remat: bool, policy: Callable | None,
                      prevent_cse: bool = True) -> Callable:
  """`fn` under our ``checkpoint`` with `policy`, or `fn` itself."""
  return checkpoint(fn, policy=policy, prevent_cse=prevent_cse) if remat else fn


class _Arrays:
  """Example arrays by shape, drawn one after another from NumPy's generator
  seeded with `seed`; with `abstract`, only their ``jax.ShapeDtypeStruct``s.

  NumPy draws them on the host, where a ``jax.random`` draw is a program
  XLA compiles first: a second of compile for each model on a CPU, more
  than drawing takes at these sizes. ``placed`` turns them into JAX arrays
  once they are all drawn.
  """

  def __init__(self, seed: int, abstract: bool):
    self._rng = None if abstract else np.random.default_rng(seed)

  def _made(self, shape, dtype, draw: Callable[[], np.ndarray]):
    if self._rng is None:
      return jax.ShapeDtypeStruct(shape, dtype)
    return draw()

  def normal(self, shape: tuple[int, ...], fan_in: int = 1, scale: float = 1.0):
    """Standard normals times `scale`, over the square root of `fan_in`."""
    factor = np.float32(scale / math.sqrt(fan_in))
    return self._made(shape, jnp.float32, lambda: factor * self._rng.standard_normal(
        shape, dtype=np.float32))

  def filled(self, shape: tuple[int, ...], value: float):
    return self._made(shape, jnp.float32, lambda: np.full(shape, value, np.float32))

  def integers(self, shape: tuple[int, ...], high: int):
    """Uniform int32s in ``[0, high)``."""
    return self._made(shape, jnp.int32, lambda: self._rng.integers(
        0, high, shape, dtype=np.int32))

  @staticmethod
  def part(array, index):
    """``array[index]``, of a drawn array or of its shape alike."""
    if isinstance(array, jax.ShapeDtypeStruct):
      return jax.eval_shape(lambda a: a[index], array)
    return array[index]

  def placed(self, tree, shardings=None):
    """`tree`'s drawn arrays as JAX arrays, on the default device or with
    `shardings` (a tree of them); abstract ones carry the shardings."""
    if self._rng is not None:  # a transfer: ``jnp.asarray`` compiles a copy
      return jax.device_put(tree, shardings)
    if shardings is None:
      return tree
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)
  return -jnp.mean(picked)


def _drawn(make_args: Callable, seed: int, abstract: bool, **sizes):
  """``make_args(arrays, **sizes)`` with ``arrays`` drawing from `seed`; with
  `abstract` only the shapes and dtypes (``jax.ShapeDtypeStruct``s, as
  ``jax.eval_shape`` gives them): nothing is allocated, so a model too large
  for this machine can still be compiled and measured (``compile_costs`` and
  the rest take such arguments)."""
  arrays = _Arrays(seed, abstract)
  return arrays.placed(make_args(arrays, **sizes))


# -- mlp ----------------------------------------------------------------------

def _mlp_args(arrays: _Arrays, *, num_layers: int, width: int, batch: int):
  params = {'w': arrays.normal((num_layers, width, width), fan_in=width),
            'b': arrays.filled((num_layers, width), 0.0)}
  return params, {'x': arrays.normal((batch, width)),
                  'target': arrays.normal((batch, width))}


def mlp(*, num_layers: int = 16, width: int = 512, batch: int = 256,
        policy: Callable | None = None, remat: bool = True,
        seed: int = 0, abstract: bool = False) -> Example:
  """A deep tanh MLP whose checkpointed layer is the body of a ``scan``.

  Params are ``{'w': (num_layers, width, width), 'b': (num_layers, width)}``;
  the batch is ``{'x', 'target'}``, both ``(batch, width)``. Each layer names
  its pre-activation ``'pre_activation'`` and its output ``'layer_output'``.
  The loss is the mean squared error against the random target.

  Saving ``'layer_output'`` saves nothing more than ``nothing_saveable``
  (as with ``jax.checkpoint``): tanh's derivative reads tanh's own result,
  not the named copy, whose other reader, the next layer, is saved anyway as
  that layer's input. Saving ``'pre_activation'`` does save a stack.
  With `abstract`, the arguments are ``jax.ShapeDtypeStruct``s.

  Example:
    >>> from remat_explorer import examples
    >>> loss_fn, (params, batch) = examples.mlp(num_layers=2, width=16, batch=4)
    >>> params['w'].shape, batch['x'].shape, loss_fn(params, batch).shape
    ((2, 16, 16), (4, 16), ())
  """
  params, data = _drawn(_mlp_args, seed, abstract,
                        num_layers=num_layers, width=width, batch=batch)

  def layer(h, p):
    pre = checkpoint_name(h @ p['w'] + p['b'], 'pre_activation')
    return checkpoint_name(jnp.tanh(pre), 'layer_output'), None

  # scan already keeps the recompute apart from the forward pass, so the
  # barrier prevent_cse adds would only cost (JAX's advice for remat in scan).
  body = _maybe_checkpoint(layer, remat=remat, policy=policy, prevent_cse=False)

  def loss_fn(params, data):
    out, _ = jax.lax.scan(body, data['x'], params)
    return jnp.mean(jnp.square(out - data['target']))

  return loss_fn, (params, data)


# -- transformer --------------------------------------------------------------

NameFn = Callable[[jax.Array, str], jax.Array]
"""How a block names its intermediates: ``checkpoint_name``, or (sharded)
a sharding constraint followed by ``checkpoint_name``."""


def _attention(x: jax.Array, p: dict[str, jax.Array], num_heads: int,
               name: NameFn = checkpoint_name) -> jax.Array:
  """Causal multi-head self-attention on ``x`` of shape (batch, seq, d)."""
  b, s, d = x.shape
  split = lambda t: t.reshape(b, s, num_heads, d // num_heads)
  q = name(split(x @ p['wq']), 'query')
  k = name(split(x @ p['wk']), 'key')
  v = name(split(x @ p['wv']), 'value')
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(d // num_heads)
  logits = name(logits, 'attention_logits')
  causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
  weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
  mixed = jnp.einsum('bhqk,bkhd->bqhd', weights, v).reshape(b, s, d)
  return name(mixed @ p['wo'], 'attention_output')


def _transformer_block(x: jax.Array, p: dict[str, jax.Array], num_heads: int,
                       name: NameFn = checkpoint_name) -> jax.Array:
  """One pre-LayerNorm block: ``x + attn(ln(x))``, then ``+ mlp(ln(.))``."""
  x = x + _attention(_layer_norm(x, p['ln1_scale'], p['ln1_bias']), p,
                     num_heads, name)
  h = _layer_norm(x, p['ln2_scale'], p['ln2_bias'])
  hidden = name(h @ p['w1'] + p['b1'], 'mlp_hidden')
  out = name(jax.nn.gelu(hidden) @ p['w2'] + p['b2'], 'mlp_output')
  return x + out


def _stacked_block_params(arrays: _Arrays, num_layers: int, d_model: int,
                          d_ff: int) -> dict[str, Any]:
  """Every block's params, stacked along a leading layer axis."""
  ones = lambda n: arrays.filled((num_layers, n), 1.0)
  zeros = lambda n: arrays.filled((num_layers, n), 0.0)
  square = (num_layers, d_model, d_model)
  return {
      'ln1_scale': ones(d_model), 'ln1_bias': zeros(d_model),
      **{w: arrays.normal(square, fan_in=d_model) for w in ('wq', 'wk', 'wv', 'wo')},
      'ln2_scale': ones(d_model), 'ln2_bias': zeros(d_model),
      'w1': arrays.normal((num_layers, d_model, d_ff), fan_in=d_model), 'b1': zeros(d_ff),
      'w2': arrays.normal((num_layers, d_ff, d_model), fan_in=d_ff), 'b2': zeros(d_model),
  }


def _transformer_args(arrays: _Arrays, *, num_layers: int, d_model: int,
                      seq_len: int, batch: int, d_ff: int, use_scan: bool):
  blocks = _stacked_block_params(arrays, num_layers, d_model, d_ff)
  if not use_scan:
    # Slices of the stacked params, so both forms hold the same numbers.
    blocks = [{k: arrays.part(a, i) for k, a in blocks.items()}
              for i in range(num_layers)]
  params = {
      'embed': arrays.normal((VOCAB_SIZE, d_model)),
      'pos': arrays.normal((seq_len, d_model), scale=0.1), 'blocks': blocks,
      'ln_scale': arrays.filled((d_model,), 1.0),
      'ln_bias': arrays.filled((d_model,), 0.0),
      'unembed': arrays.normal((d_model, VOCAB_SIZE), fan_in=d_model),
  }
  tokens = arrays.integers((batch, seq_len + 1), VOCAB_SIZE)
  return params, {'tokens': arrays.part(tokens, np.s_[:, :-1]),
                  'targets': arrays.part(tokens, np.s_[:, 1:])}


def transformer(*, num_layers: int = 4, d_model: int = 128,
                num_heads: int = 4, seq_len: int = 64, batch: int = 8,
                d_ff: int | None = None, use_scan: bool = False,
                policy: Callable | None = None, remat: bool = True,
                seed: int = 0, abstract: bool = False) -> Example:
  """A decoder-only, pre-LayerNorm transformer on random tokens.

  Each block (causal self-attention, then a gelu MLP of width `d_ff`,
  default ``4 * d_model``) is checkpointed and names the values in
  ``TRANSFORMER_NAMES``. With ``use_scan=False`` ``params['blocks']`` is a
  list of per-layer dicts and the blocks are unrolled by a Python loop; with
  ``use_scan=True`` it is one dict stacked along a leading layer axis and the
  block is the body of a ``scan``. Both hold the same numbers for a seed.
  The batch is ``{'tokens', 'targets'}`` (next-token targets), both
  ``(batch, seq_len)`` int32; the loss is the mean cross-entropy. With
  `abstract`, the arguments are ``jax.ShapeDtypeStruct``s.

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples
    >>> loss_fn, (params, batch) = examples.transformer(num_layers=2, d_model=32, seq_len=16, batch=2)
    >>> len(params['blocks']), batch['tokens'].shape
    (2, (2, 16))
    >>> rx.analyze(loss_fn, params, batch).names_in_program
    ('attention_logits', 'attention_output', 'key', 'mlp_hidden', 'mlp_output',
     'query', 'value')
  """
  if d_model % num_heads:
    raise ValueError(f'd_model={d_model} is not divisible by '
                     f'num_heads={num_heads}.')
  d_ff = 4 * d_model if d_ff is None else d_ff
  params, data = _drawn(
      _transformer_args, seed, abstract, num_layers=num_layers,
      d_model=d_model, seq_len=seq_len, batch=batch, d_ff=d_ff, use_scan=use_scan)

  loss_fn = _transformer_loss(num_heads=num_heads, use_scan=use_scan,
                              remat=remat, policy=policy)
  return loss_fn, (params, data)


def _transformer_loss(*, num_heads: int, use_scan: bool, remat: bool,
                      policy: Callable | None,
                      name: NameFn = checkpoint_name) -> LossFn:
  block = functools.partial(_transformer_block, num_heads=num_heads, name=name)
  checkpointed = _maybe_checkpoint(block, remat=remat, policy=policy,
                                   prevent_cse=not use_scan)  # See mlp().

  def loss_fn(params, data):
    x = params['embed'][data['tokens']] + params['pos']
    if use_scan:
      x, _ = jax.lax.scan(lambda x, p: (checkpointed(x, p), None), x,
                          params['blocks'])
    else:
      for p in params['blocks']:
        x = checkpointed(x, p)
    x = _layer_norm(x, params['ln_scale'], params['ln_bias'])
    return _cross_entropy(x @ params['unembed'], data['targets'])

  return loss_fn


# -- transformer on a device mesh -----------------------------------------------

MESH_AXES = ('data', 'model')

# Megatron-style tensor parallelism: the attention heads and the MLP's hidden
# units are split over 'model' (column-parallel wq/wk/wv/w1, row-parallel
# wo/w2), the batch over 'data'; norms and the residual stream's features
# are replicated over 'model'.
_BLOCK_PARAM_SPECS = {
    'ln1_scale': P(), 'ln1_bias': P(), 'ln2_scale': P(), 'ln2_bias': P(),
    'wq': P(None, 'model'), 'wk': P(None, 'model'), 'wv': P(None, 'model'),
    'wo': P('model', None), 'w1': P(None, 'model'), 'b1': P('model'),
    'w2': P('model', None), 'b2': P(),
}
_TOP_PARAM_SPECS = {'embed': P(), 'pos': P(), 'ln_scale': P(), 'ln_bias': P(),
                    'unembed': P(None, 'model')}
ACTIVATION_SPECS = {
    'query': P('data', None, 'model', None), 'key': P('data', None, 'model', None),
    'value': P('data', None, 'model', None),
    'attention_logits': P('data', 'model', None, None),
    'attention_output': P('data', None, None),
    'mlp_hidden': P('data', None, 'model'), 'mlp_output': P('data', None, None),
}
"""The sharding each named intermediate of ``sharded_transformer`` is
constrained to: (batch, seq, heads, head_dim) for query/key/value, (batch,
heads, q, k) for the logits, (batch, seq, features) for the rest."""


def data_model_mesh(data: int, model: int, devices=None) -> Mesh:
  """A ``('data', 'model')`` mesh of ``data * model`` devices (the first
  ones unless `devices` says), with Auto axes.

  Auto axes let the SPMD partitioner choose the sharding of every value the
  program does not constrain, as in any ``jit`` program; ``jax.make_mesh``
  defaults to Explicit axes in JAX 0.10.2, under which each matmul whose
  contracting dimension is sharded must name its output sharding.

  Example:
    >>> from remat_explorer import examples
    >>> mesh = examples.data_model_mesh(1, 1)
    >>> dict(mesh.shape), [t.name for t in mesh.axis_types]
    ({'data': 1, 'model': 1}, ['Auto', 'Auto'])
  """
  devices = jax.devices()[:data * model] if devices is None else list(devices)
  if data < 1 or model < 1 or len(devices) != data * model:
    raise ValueError(
        f'a {data} x {model} mesh needs {data * model} devices; got '
        f'{len(devices)} ({len(jax.devices())} available). On a CPU, set '
        'XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX is '
        'imported to get 8 host devices.')
  return jax.make_mesh((data, model), MESH_AXES, devices=devices,
                       axis_types=(AxisType.Auto,) * 2)


def _check_mesh_fits(mesh: Mesh, *, batch: int, num_heads: int, d_ff: int) -> None:
  if tuple(mesh.axis_names) != MESH_AXES:
    raise ValueError(
        f'sharded_transformer needs a mesh with axes {MESH_AXES} (see '
        f'data_model_mesh), got axes {tuple(mesh.axis_names)}.')
  data, model = mesh.shape['data'], mesh.shape['model']
  for what, size, axis, n in (('batch', batch, 'data', data),
                              ('num_heads', num_heads, 'model', model),
                              ('d_ff', d_ff, 'model', model),
                              ('VOCAB_SIZE', VOCAB_SIZE, 'model', model)):
    if size % n:
      raise ValueError(f'{what}={size} is not divisible by the {n} devices '
                       f'of mesh axis {axis!r}.')


def _param_shardings(mesh: Mesh, params: dict, use_scan: bool, fsdp: bool) -> dict:
  """A NamedSharding for every parameter; stacked block params keep their
  leading layer axis unsharded. With `fsdp`, each matrix's dimension that
  'model' leaves whole is split over 'data' too (where it divides), as
  fully sharded data parallelism stores weights."""
  lead = (None,) if use_scan else ()
  shapes = {**{k: params[k].shape for k in _TOP_PARAM_SPECS},
            **{k: v.shape[len(lead):] for k, v in
               (params['blocks'] if use_scan else params['blocks'][0]).items()}}

  def named(name, spec, extra=()):
    spec = tuple(spec) + (None,) * (len(shapes[name]) - len(spec))
    free = [i for i, (axis, size) in enumerate(zip(spec, shapes[name]))
            if axis is None and size % mesh.shape['data'] == 0]
    if fsdp and len(shapes[name]) == 2 and free:
      spec = tuple('data' if i == free[0] else axis for i, axis in enumerate(spec))
    return NamedSharding(mesh, P(*extra, *spec))
  block = {k: named(k, spec, lead) for k, spec in _BLOCK_PARAM_SPECS.items()}
  blocks = block if use_scan else [dict(block) for _ in params['blocks']]
  return {**{k: named(k, spec) for k, spec in _TOP_PARAM_SPECS.items()},
          'blocks': blocks}


def sharded_transformer(mesh: Mesh, *, num_layers: int = 2, d_model: int = 64,
                        num_heads: int = 4, seq_len: int = 32, batch: int | None = None,
                        d_ff: int | None = None, use_scan: bool = False,
                        policy: Callable | None = None, remat: bool = True,
                        seed: int = 0, fsdp: bool = False,
                        abstract: bool | None = None) -> Example:
  """``transformer`` on a 2D ``('data', 'model')`` mesh: data parallel over
  the batch, tensor (model) parallel inside each block.

  The params and the batch are placed on `mesh` with ``NamedSharding``
  (heads and MLP hidden units split over ``'model'``, Megatron style; the
  batch over ``'data'``), and every value named in ``TRANSFORMER_NAMES`` is
  constrained to its ``ACTIVATION_SPECS`` sharding before it is named.
  ``jax.jit(loss_fn)`` is then one SPMD program that XLA partitions over the
  mesh; the numbers are those of ``transformer`` with the same sizes and
  seed. Build the mesh with ``data_model_mesh(data, model)``, or over an
  accelerator this machine does not have with ``target_mesh``.

  `batch`: by default as near 8 as the mesh's ``'data'`` axis divides,
  and at least one sequence per data shard (64 on a ``'data'`` axis of 64).
  `fsdp`: the weights sharded over 'data' too (``_param_shardings``).
  `abstract`: the arguments as ``jax.ShapeDtypeStruct``s carrying their
  shardings, nothing allocated; the default is abstract exactly when the
  mesh's devices can only compile (a ``target_mesh``'s).

  Example:
    >>> import remat_explorer as rx
    >>> from remat_explorer import examples
    >>> mesh = rx.target_mesh('h100:8', {'data': 2, 'model': 4})
    >>> loss_fn, (params, batch) = examples.sharded_transformer(mesh)
    >>> tokens, wq = batch['tokens'], params['blocks'][0]['wq']
    >>> tokens.sharding.shard_shape(tokens.shape), wq.sharding.shard_shape(wq.shape)
    ((4, 32), (64, 16))
  """
  d_ff = 4 * d_model if d_ff is None else d_ff
  if batch is None:
    data = mesh.shape.get('data', 1)
    batch = data * max(1, 8 // data)
  _check_mesh_fits(mesh, batch=batch, num_heads=num_heads, d_ff=d_ff)
  if d_model % num_heads:
    raise ValueError(f'd_model={d_model} is not divisible by '
                     f'num_heads={num_heads}.')
  if abstract is None:
    from remat_explorer import engine
    abstract = engine.is_compile_only(mesh.devices.flat[0])
  # Drawn, then placed on the mesh at once (one transfer).
  arrays = _Arrays(seed, abstract)
  params, data = _transformer_args(
      arrays, num_layers=num_layers, d_model=d_model, seq_len=seq_len, batch=batch,
      d_ff=d_ff, use_scan=use_scan)
  params = arrays.placed(params, _param_shardings(mesh, params, use_scan, fsdp))
  data_sharding = NamedSharding(mesh, P('data', None))
  data = arrays.placed(data, jax.tree_util.tree_map(lambda _: data_sharding, data))

  def name(value: jax.Array, label: str) -> jax.Array:
    spec = NamedSharding(mesh, ACTIVATION_SPECS[label])
    return checkpoint_name(jax.lax.with_sharding_constraint(value, spec), label)

  loss_fn = _transformer_loss(num_heads=num_heads, use_scan=use_scan,
                              remat=remat, policy=policy, name=name)
  return loss_fn, (params, data)


# -- convnet ------------------------------------------------------------------

def _conv3x3(x: jax.Array, kernel: jax.Array) -> jax.Array:
  return jax.lax.conv_general_dilated(
      x, kernel, window_strides=(1, 1), padding='SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def _convnet_args(arrays: _Arrays, *, num_blocks: int, channels: int,
                  image_size: int, batch: int, num_classes: int):
  c_ins = [3 if i == 0 else channels for i in range(num_blocks)]
  blocks = [{'kernel': arrays.normal((3, 3, c_in, channels), fan_in=9 * c_in),
             'bias': arrays.filled((channels,), 0.0)}
            for c_in in c_ins]
  params = {'blocks': blocks,
            'head': arrays.normal((channels, num_classes), fan_in=channels),
            'head_bias': arrays.filled((num_classes,), 0.0)}
  return params, {'images': arrays.normal((batch, image_size, image_size, 3)),
                  'labels': arrays.integers((batch,), num_classes)}


def convnet(*, num_blocks: int = 3, channels: int = 16, image_size: int = 32,
            batch: int = 8, num_classes: int = 10,
            policy: Callable | None = None, remat: bool = True,
            seed: int = 0, abstract: bool = False) -> Example:
  """A stack of checkpointed 3x3 conv + relu blocks and a dense classifier.

  Images are NHWC ``(batch, image_size, image_size, 3)``; block ``i`` has a
  HWIO kernel ``(3, 3, c_in, channels)`` and a bias, and names its conv
  result (before relu) ``'conv_output'``. A global average pool feeds the
  classifier; the loss is the softmax cross-entropy against random labels.
  With `abstract`, the arguments are ``jax.ShapeDtypeStruct``s.

  Example:
    >>> from remat_explorer import examples
    >>> loss_fn, (params, batch) = examples.convnet(num_blocks=2, channels=8, image_size=8, batch=2)
    >>> batch['images'].shape, batch['labels'].shape, loss_fn(params, batch).shape
    ((2, 8, 8, 3), (2,), ())
  """
  if num_blocks < 1:
    raise ValueError(f'convnet needs num_blocks >= 1, got {num_blocks}.')
  params, data = _drawn(
      _convnet_args, seed, abstract, num_blocks=num_blocks,
      channels=channels, image_size=image_size, batch=batch, num_classes=num_classes)

  def block(x, p):
    y = checkpoint_name(_conv3x3(x, p['kernel']) + p['bias'], 'conv_output')
    return jax.nn.relu(y)

  checkpointed = _maybe_checkpoint(block, remat=remat, policy=policy)

  def loss_fn(params, data):
    x = data['images']
    for p in params['blocks']:
      x = checkpointed(x, p)
    pooled = jnp.mean(x, axis=(1, 2))
    logits = pooled @ params['head'] + params['head_bias']
    return _cross_entropy(logits, data['labels'])

  return loss_fn, (params, data)


# -- registry -----------------------------------------------------------------

MODELS: dict[str, Callable[..., Example]] = {
    'mlp': mlp, 'transformer': transformer, 'convnet': convnet}


def build(name: str, **sizes: Any) -> Example:
  """``MODELS[name](**sizes)``, with an error listing the models if unknown.

  Example:
    >>> from remat_explorer import examples
    >>> loss_fn, (params, batch) = examples.build('mlp', num_layers=2, width=16, batch=4)
    >>> params['w'].shape
    (2, 16, 16)
    >>> examples.build('resnet')
    Traceback (most recent call last):
    ...
    ValueError: Unknown example model 'resnet'; available: convnet, mlp, transformer.
  """
  try:
    builder = MODELS[name]
  except KeyError:
    raise ValueError(f'Unknown example model {name!r}; available: '
                     f'{", ".join(sorted(MODELS))}.') from None
  return builder(**sizes)
