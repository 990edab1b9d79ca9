"""Models written as users of Flax, Equinox and Haiku write them, unchanged
by the explorer: a Flax Linen ``nn.scan(nn.remat(Block))`` stack trained
with an optax loss, a Flax NNX ``nnx.scan`` + ``nnx.remat`` model with
``checkpoint_name``s, an Equinox model whose scanned layers are
``eqx.filter_checkpoint``ed, and a Haiku ``hk.layer_stack`` over
``hk.remat`` of a lambda calling the block; and a convnet written
channels-first, as PyTorch and Equinox lay out images. Each builder returns ``(loss_fn, args)`` with
the parameters first, from a fixed seed; ``remat=False`` builds the same
model as its user would without remat."""

import equinox as eqx
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import remat_explorer as rx

VOCAB = 128


# -- Flax Linen --------------------------------------------------------------------

class LinenBlock(nn.Module):
  d_model: int
  num_heads: int

  @nn.compact
  def __call__(self, x, _):
    h = nn.LayerNorm(name='ln_attn')(x)
    qkv = checkpoint_name(nn.Dense(3 * self.d_model, name='qkv')(h), 'qkv')
    q, k, v = jnp.split(qkv, 3, axis=-1)
    b, t, d = q.shape
    heads = lambda y: y.reshape(b, t, self.num_heads, d // self.num_heads)
    logits = jnp.einsum('bqhd,bkhd->bhqk', heads(q), heads(k)) / (d // self.num_heads) ** 0.5
    probs = jax.nn.softmax(logits, axis=-1)
    attended = jnp.einsum('bhqk,bkhd->bqhd', probs, heads(v)).reshape(b, t, d)
    x = x + nn.Dense(d, name='attn_out')(attended)
    h = nn.LayerNorm(name='ln_mlp')(x)
    h = checkpoint_name(jax.nn.gelu(nn.Dense(4 * d, name='mlp_in')(h)), 'mlp_hidden')
    return x + nn.Dense(d, name='mlp_out')(h), None


class LinenModel(nn.Module):
  num_layers: int = 3
  d_model: int = 32
  num_heads: int = 4
  remat: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, self.d_model, name='embed')(tokens)
    policy = jax.checkpoint_policies.save_only_these_names('qkv', 'mlp_hidden')
    block = (nn.remat(LinenBlock, policy=policy, prevent_cse=False) if self.remat
             else LinenBlock)
    stack = nn.scan(block,
                    variable_axes={'params': 0}, split_rngs={'params': True},
                    length=self.num_layers)
    x, _ = stack(self.d_model, self.num_heads, name='blocks')(x, None)
    return nn.Dense(VOCAB, name='head')(nn.LayerNorm(name='ln_final')(x))


def _linen_lm(model, batch, seq, seed):
  """A Linen LM's next-token loss and its (params, tokens): tokens drawn
  from key `seed`, parameters from key `seed` + 1."""
  tokens = jax.random.randint(jax.random.key(seed), (batch, seq), 0, VOCAB)
  params = model.init(jax.random.key(seed + 1), tokens)['params']

  def loss_fn(params, tokens):
    logits = model.apply({'params': params}, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], tokens[:, 1:]).mean()
  return loss_fn, (params, tokens)


def linen_transformer(batch=4, seq=16, remat=True):
  return _linen_lm(LinenModel(remat=remat), batch, seq, seed=0)


class LinenMlpBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.gelu(nn.Dense(4 * x.shape[-1], name='up')(nn.LayerNorm(name='norm')(x)))
    return x + nn.Dense(x.shape[-1], name='down')(h)


class LinenRematScanModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.remat_scan(LinenMlpBlock, lengths=(2, 3),
                          policy=jax.checkpoint_policies.dots_saveable)
    return jnp.mean(stack(name='stack')(x) ** 2)


class LinenUnrolledModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = nn.remat(LinenMlpBlock)(name=f'block{i}')(x)
    return jnp.mean(x ** 2)


class LinenHeadsBlock(nn.Module):
  """An attention-like block whose heads are weighed by ``jnp.einsum``
  with a spec, which JAX adds to the name stack."""

  @nn.compact
  def __call__(self, x):
    b, t, d = x.shape
    q = nn.Dense(d, name='query')(x).reshape(b, t, 4, d // 4)
    k = nn.Dense(d, name='key')(x).reshape(b, t, 4, d // 4)
    weights = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k))
    weights = jnp.einsum('...hqk,h->...hqk', weights, jnp.linspace(0.5, 1.5, 4))
    mixed = jnp.einsum('bhqk,bkhd->bqhd', weights, q).reshape(b, t, d)
    return x + nn.Dense(d, name='out')(jnp.tanh(mixed))


class LinenLayerList(nn.Module):
  """Layers made in ``setup`` as a list named by their index and run by a
  loop, as Hugging Face's Flax models build theirs (``bert/encoder/layer/0``):
  every layer's equations come from the same lines."""
  depth: int = 3

  def setup(self):
    self.layers = [nn.remat(LinenHeadsBlock)(name=str(i)) for i in range(self.depth)]

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class LinenLayerListModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.mean(LinenLayerList(name='encoder')(x) ** 2)


def _linen_on_activations(model, batch, seq, width, seed):
  """A Linen model of activations, as ``(loss_fn, (params, x))``: x drawn
  from key `seed`, parameters from key `seed` + 1."""
  x = jax.random.normal(jax.random.key(seed), (batch, seq, width))
  params = model.init(jax.random.key(seed + 1), x)['params']
  return lambda params, x: model.apply({'params': params}, x), (params, x)


def linen_layer_list(batch=4, seq=16, width=32):
  return _linen_on_activations(LinenLayerListModel(), batch, seq, width, seed=9)


def linen_unrolled(batch=4, seq=16, width=32):
  """Three ``nn.remat``ed blocks in a Python loop, unrolled."""
  return _linen_on_activations(LinenUnrolledModel(), batch, seq, width, seed=11)


def linen_remat_scan(batch=4, seq=16, width=32):
  """Flax's own ``nn.remat_scan``: six blocks as two remat'ed steps of a
  scan over three."""
  return _linen_on_activations(LinenRematScanModel(), batch, seq, width, seed=7)


# A Griffin-style recurrent LM (recurrentgemma's shape, written here): each
# block a gated linear recurrence (RG-LRU) run by an unrolled inner
# ``lax.scan`` beside an MLP, the blocks ``nn.remat``ed and unrolled.

class LinenRgLru(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    gate_x = nn.sigmoid(nn.Dense(self.width, name='input_gate')(x))
    gate_a = nn.sigmoid(nn.Dense(self.width, name='a_gate')(x))
    decay = nn.softplus(self.param('a_param', nn.initializers.normal(1.0), (self.width,)))
    log_a = -8.0 * gate_a * decay
    normed = x * gate_x * jnp.sqrt(1 - jnp.exp(2 * log_a))

    def step(h, inputs):
      a_t, x_t = inputs
      h = a_t * h + x_t
      return h, h
    _, ys = jax.lax.scan(step, jnp.zeros((x.shape[0], x.shape[2])),
                         (jnp.exp(log_a).swapaxes(0, 1), normed.swapaxes(0, 1)), unroll=16)
    return ys.swapaxes(0, 1)


class LinenRecurrentBlock(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    h = nn.RMSNorm(name='norm')(x)
    y = nn.gelu(nn.Dense(self.width, name='y_proj')(h))
    recurrent = LinenRgLru(self.width, name='rg_lru')(nn.Dense(self.width, name='x_proj')(h))
    x = x + nn.Dense(self.width, name='out')(recurrent * y)
    h = nn.RMSNorm(name='mlp_norm')(x)
    return x + nn.Dense(self.width, name='down')(nn.gelu(nn.Dense(3 * self.width, name='up')(h)))


class LinenRecurrentModel(nn.Module):
  width: int = 64
  depth: int = 3
  remat: bool = True
  policy: object = None

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, self.width, name='embed')(tokens)
    block = (nn.remat(LinenRecurrentBlock, policy=self.policy) if self.remat
             else LinenRecurrentBlock)
    for i in range(self.depth):
      x = block(self.width, name=f'block{i}')(x)
    return nn.Dense(VOCAB, name='head')(nn.RMSNorm(name='final_norm')(x))


def linen_recurrent(batch=4, seq=64, width=64, depth=3, remat=True, policy=None):
  model = LinenRecurrentModel(width=width, depth=depth, remat=remat, policy=policy)
  return _linen_lm(model, batch, seq, seed=5)


# recurrentgemma's own Griffin, installed from PyPI (the benches only).

def griffin(blocks=3, width=64, remat=True):
  """Griffin as recurrentgemma ships it (``pip install recurrentgemma``; the
  benches' outside model installed as a package, not a test dependency):
  `blocks` cycling recurrent, recurrent, attention, batch 4 x 256 tokens.
  Its blocks are ``nn.remat``ed with no policy argument."""
  import recurrentgemma.jax as rg
  from recurrentgemma import common
  kinds = (common.TemporalBlockType.RECURRENT, common.TemporalBlockType.RECURRENT,
           common.TemporalBlockType.ATTENTION)
  config = common.GriffinConfig(
      vocab_size=1024, width=width, mlp_expanded_width=3 * width, num_heads=4,
      block_types=tuple(kinds[i % 3] for i in range(blocks)),
      embeddings_scale_by_sqrt_dim=True, attention_window_size=128, logits_soft_cap=30.0)
  model = rg.Griffin(config, gradient_checkpointing=remat)
  tokens = jax.random.randint(jax.random.key(0), (4, 256), 0, 1024)
  positions = jnp.broadcast_to(jnp.arange(256, dtype=jnp.int32), (4, 256))
  params = model.init(jax.random.key(1), tokens, positions, return_cache=False)['params']

  def loss_fn(params, tokens):
    logits, _ = model.apply({'params': params}, tokens, positions, return_cache=False)
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))
  return loss_fn, (params, tokens)


# Hugging Face's Flax BERT, installed from PyPI (the benches only): its layers
# a list run by a loop, each ``nn.remat``ed (``enable_gradient_checkpointing``).

def hf_bert(layers=4, width=256, batch=8, seq=256, vocab=8192):
  """``transformers``' ``FlaxBertForMaskedLM`` (``pip install
  'transformers<5'``, whose Flax models 4.x ships; not a test dependency),
  its layers remat'ed as the library does it, with a masked-LM loss over
  every token."""
  from transformers import BertConfig, FlaxBertForMaskedLM
  config = BertConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=4,
                      intermediate_size=4 * width, max_position_embeddings=seq,
                      vocab_size=vocab)
  model = FlaxBertForMaskedLM(config, seed=11, dtype=jnp.float32)
  model.enable_gradient_checkpointing()
  tokens = jax.random.randint(jax.random.key(12), (batch, seq), 0, vocab)

  def loss_fn(params, tokens):
    logits = model(tokens, params=params, train=False).logits
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))
  return loss_fn, (model.params, tokens)


def hf_whisper(layers=4, width=256, batch=2, frames=1500, target_len=128, vocab=8192,
               remat=True):
  """``transformers``' ``FlaxWhisperForConditionalGeneration`` (installed as
  for ``hf_bert``): an encoder-decoder whose encoder starts with two
  convolutions over log-mel frames, its layers remat'ed by
  ``enable_gradient_checkpointing`` (unless not `remat`), with a next-token
  loss over the decoder's tokens. Its weights are abstract (``_do_init=False``, their
  shapes from ``jax.eval_shape``): compiling needs no more."""
  from transformers import WhisperConfig, FlaxWhisperForConditionalGeneration
  config = WhisperConfig(vocab_size=vocab, d_model=width, encoder_layers=layers,
                         decoder_layers=layers, encoder_attention_heads=8,
                         decoder_attention_heads=8, encoder_ffn_dim=4 * width,
                         decoder_ffn_dim=4 * width, num_mel_bins=80,
                         max_source_positions=frames // 2, max_target_positions=target_len)
  model = FlaxWhisperForConditionalGeneration(config, seed=13, dtype=jnp.float32,
                                              _do_init=False, input_shape=(1, 80, frames))
  if remat:
    model.enable_gradient_checkpointing()
  params = jax.eval_shape(lambda key: model.init_weights(key, (1, 80, frames)),
                          jax.random.key(13))
  rng = np.random.default_rng(14)
  batch_ = (jnp.asarray(rng.standard_normal((batch, 80, frames)), jnp.float32),
            jnp.asarray(rng.integers(0, vocab, (batch, target_len)), jnp.int32))

  def loss_fn(params, batch):
    mel, ids = batch
    logits = model(mel, decoder_input_ids=ids, params=params, train=True).logits
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))
  return loss_fn, (params, batch_)


# -- Flax NNX -----------------------------------------------------------------------

class Attention(nnx.Module):
  def __init__(self, d, heads, rngs):
    self.query = nnx.Linear(d, d, rngs=rngs)
    self.key = nnx.Linear(d, d, rngs=rngs)
    self.value = nnx.Linear(d, d, rngs=rngs)
    self.out = nnx.Linear(d, d, rngs=rngs)
    self.heads = heads

  def __call__(self, x):
    b, t, d = x.shape
    split = lambda y: y.reshape(b, t, self.heads, d // self.heads)
    q = checkpoint_name(split(self.query(x)), 'query')
    k, v = split(self.key(x)), split(self.value(x))
    probs = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k) / (d // self.heads) ** 0.5)
    probs = checkpoint_name(probs, 'attention_probs')
    return self.out(jnp.einsum('bhqk,bkhd->bqhd', probs, v).reshape(b, t, d))


class NnxBlock(nnx.Module):
  def __init__(self, d, heads, rngs):
    self.norm1 = nnx.LayerNorm(d, rngs=rngs)
    self.attention = Attention(d, heads, rngs)
    self.norm2 = nnx.LayerNorm(d, rngs=rngs)
    self.mlp_in = nnx.Linear(d, 4 * d, rngs=rngs)
    self.mlp_out = nnx.Linear(4 * d, d, rngs=rngs)

  def __call__(self, x):
    x = x + self.attention(self.norm1(x))
    h = checkpoint_name(jax.nn.gelu(self.mlp_in(self.norm2(x))), 'mlp_hidden')
    return x + self.mlp_out(h)


class NnxModel(nnx.Module):
  def __init__(self, layers=3, d=32, heads=4, *, rngs, remat=True):
    self.remat = remat
    self.embed = nnx.Embed(VOCAB, d, rngs=rngs)

    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_block(rngs):
      return NnxBlock(d, heads, rngs)
    self.blocks = make_block(rngs)
    self.head = nnx.Linear(d, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    policy = jax.checkpoint_policies.save_only_these_names('query', 'mlp_hidden')

    def run(x, block):
      return block(x)
    if self.remat:
      run = nnx.remat(run, policy=policy)
    return self.head(nnx.scan(run, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(x, self.blocks))


def nnx_transformer(batch=4, seq=16, remat=True):
  graphdef, params = nnx.split(NnxModel(rngs=nnx.Rngs(0), remat=remat))
  tokens = jax.random.randint(jax.random.key(2), (batch, seq), 0, VOCAB)

  def loss_fn(params, tokens):
    logits = nnx.merge(graphdef, params)(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()
  return loss_fn, (params, tokens)


# -- Equinox ------------------------------------------------------------------------

class EqxLayer(eqx.Module):
  norm1: eqx.nn.LayerNorm
  attention: eqx.nn.MultiheadAttention
  norm2: eqx.nn.LayerNorm
  mlp_in: eqx.nn.Linear
  mlp_out: eqx.nn.Linear

  def __init__(self, d, heads, key):
    k1, k2, k3 = jax.random.split(key, 3)
    self.norm1, self.norm2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
    self.attention = eqx.nn.MultiheadAttention(heads, d, key=k1)
    self.mlp_in = eqx.nn.Linear(d, 4 * d, key=k2)
    self.mlp_out = eqx.nn.Linear(4 * d, d, key=k3)

  def __call__(self, x):
    h = jax.vmap(self.norm1)(x)
    x = x + self.attention(h, h, h)
    h = jax.nn.gelu(jax.vmap(self.mlp_in)(jax.vmap(self.norm2)(x)))
    return x + jax.vmap(self.mlp_out)(checkpoint_name(h, 'mlp_hidden'))


class EqxModel(eqx.Module):
  embed: eqx.nn.Embedding
  layers: EqxLayer
  head: eqx.nn.Linear

  remat: bool = eqx.field(static=True)

  def __init__(self, layers=3, d=32, heads=4, *, key, remat=True):
    self.remat = remat
    k1, k2, k3 = jax.random.split(key, 3)
    self.embed = eqx.nn.Embedding(VOCAB, d, key=k1)
    self.layers = eqx.filter_vmap(lambda k: EqxLayer(d, heads, k))(jax.random.split(k2, layers))
    self.head = eqx.nn.Linear(d, VOCAB, key=k3)

  def __call__(self, tokens):
    x = jax.vmap(self.embed)(tokens)
    dynamic, static = eqx.partition(self.layers, eqx.is_array)

    def layer_step(x, params):
      return eqx.combine(params, static)(x)
    if self.remat:
      layer_step = eqx.filter_checkpoint(
          layer_step, policy=jax.checkpoint_policies.save_only_these_names('mlp_hidden'))
    x, _ = jax.lax.scan(lambda x, p: (layer_step(x, p), None), x, dynamic)
    return jax.vmap(self.head)(x)


def equinox_transformer(batch=4, seq=16, remat=True):
  model = EqxModel(key=jax.random.key(3), remat=remat)
  tokens = jax.random.randint(jax.random.key(4), (batch, seq), 0, VOCAB)

  def loss_fn(model, tokens):
    logits = jax.vmap(model)(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()
  return loss_fn, (model, tokens)


# -- Channels-first ----------------------------------------------------------------

def channels_first_convnet(num_blocks=3, channels=16, image_size=32, batch=8, seed=0,
                           remat=True, policy=None):
  """The example convnet's blocks written channels-first (NCHW images, OIHW
  kernels, as PyTorch and Equinox lay them out), with the package's own
  ``checkpoint`` under `policy`, and the mean square of the last block's
  output as the loss. XLA:CPU copies every convolution's operands into its
  own layout."""
  rng = np.random.default_rng(seed)
  kernels = [jnp.asarray(rng.standard_normal((channels, 3 if i == 0 else channels, 3, 3))
                         / np.sqrt(9 * (3 if i == 0 else channels)), jnp.float32)
             for i in range(num_blocks)]
  images = jnp.asarray(rng.standard_normal((batch, 3, image_size, image_size)), jnp.float32)

  def block(x, kernel):
    y = jax.lax.conv_general_dilated(x, kernel, (1, 1), 'SAME',
                                     dimension_numbers=('NCHW', 'OIHW', 'NCHW'))
    return jax.nn.relu(rx.checkpoint_name(y, 'conv_output'))
  if remat:
    block = rx.checkpoint(block, policy=policy)

  def loss(kernels, images):
    for kernel in kernels:
      images = block(images, kernel)
    return jnp.mean(images ** 2)
  return loss, (kernels, images)


# -- Haiku --------------------------------------------------------------------------

class HkBlock(hk.Module):
  def __call__(self, x):
    h = hk.LayerNorm(-1, True, True, name='norm1')(x)
    q = checkpoint_name(hk.Linear(x.shape[-1], name='query')(h), 'query')
    k, v = hk.Linear(x.shape[-1], name='key')(h), hk.Linear(x.shape[-1], name='value')(h)
    probs = jax.nn.softmax(jnp.einsum('btd,bsd->bts', q, k) / x.shape[-1] ** 0.5)
    x = x + hk.Linear(x.shape[-1], name='out')(jnp.einsum('bts,bsd->btd', probs, v))
    h = hk.LayerNorm(-1, True, True, name='norm2')(x)
    h = checkpoint_name(jax.nn.gelu(hk.Linear(4 * x.shape[-1], name='mlp_in')(h)), 'mlp_hidden')
    return x + hk.Linear(x.shape[-1], name='mlp_out')(h)


def haiku_transformer(batch=4, seq=16, remat=True, layers=3, d=32):
  """``hk.layer_stack`` over ``hk.remat`` of a block, as Haiku's users scan
  their layers."""
  def forward(tokens):
    x = hk.Embed(VOCAB, d)(tokens)
    layer = lambda x: HkBlock(name='block')(x)
    if remat:
      layer = hk.remat(layer, policy=jax.checkpoint_policies.save_only_these_names(
          'query', 'mlp_hidden'))
    x = hk.layer_stack(layers)(layer)(x)
    return hk.Linear(VOCAB, name='head')(x)
  model = hk.without_apply_rng(hk.transform(forward))
  tokens = jax.random.randint(jax.random.key(5), (batch, seq), 0, VOCAB)
  params = model.init(jax.random.key(6), tokens)

  def loss_fn(params, tokens):
    return optax.softmax_cross_entropy_with_integer_labels(
        model.apply(params, tokens), tokens).mean()
  return loss_fn, (params, tokens)


def haiku_mlps(batch=8, width=32, layers=2):
  """Haiku's own ``hk.nets.MLP``, each ``hk.remat``ed in a lambda: its
  parameters are named ``mlp/~/linear_0``, its name stack ``mlp/linear_0``."""
  def forward(x):
    for _ in range(layers):
      x = x + hk.remat(lambda x: hk.nets.MLP([4 * width, width], activation=jax.nn.gelu)(x))(x)
    return jnp.mean(x ** 2)
  model = hk.without_apply_rng(hk.transform(forward))
  x = jax.random.normal(jax.random.key(9), (batch, width))
  return model.apply, (model.init(jax.random.key(10), x), x)


MODELS = {'linen': linen_transformer, 'nnx': nnx_transformer, 'equinox': equinox_transformer,
          'haiku': haiku_transformer}
