"""What XLA's backend does to a step's values that its jaxpr does not say,
as far as the liveness model of ``jaxpr_memory.py`` takes it into account.

Each rule was read off XLA's compiled programs (the buffers live at the
compiled peak, ``bench/estimates.py``) and is kept to the platform it was
read on:

* **Convolution layouts** (CPU). XLA:CPU runs a convolution on its image in
  batch-spatial-feature order and its kernel in spatial-in-out order (NHWC
  and HWIO). An operand in any other order, as the kernel gradient's image
  and output gradient or the input gradient's flipped kernel are, is copied
  into that order: a new buffer of the operand's size, made as soon as the
  operand is (the copy fuses what makes it), and read by the convolution in
  its place.
* **Reductions and broadcasts** (CPU). XLA:CPU's reductions fuse the
  elementwise work that feeds them, but not a broadcast along the minor
  dimension (a layer norm's ``x - mean``): the value that reads such a
  broadcast is made apart, and kept as long as anything reads it.
* **Cheap values repeated in their readers** (CPU). XLA:CPU's fusion
  repeats a cheap elementwise value (a bias added to a matmul's output) in
  each fusion that reads it, and makes it apart only for the readers that
  cannot fuse it (the next matmuls): the matmul's output it reads stays
  live until the last fusion that repeats it, in the backward pass if that
  is where one is. Kept to a value with one operand of its size, that
  operand made by an equation XLA does not fuse: read more widely (that
  operand made by anything) it put the example transformer's estimate,
  unrolled, 9-10% over its compiled peak.
* **Loop state made first** (CPU). XLA:CPU copies each loop's initial
  state (its carry and the zeros its stacked outputs are written into) into
  the loop's own buffers, and its scheduler places those copies at the start
  of the program: every loop's carry and stacked outputs are live from then
  on, not from when the loop runs (a recurrent model's backward loops hold
  their outputs through the whole forward pass).

* **Values both passes read** (CPU). Without remat between them, XLA
  sees the forward and backward passes as one program: a value both read
  lies on both sides of the loss, and XLA:CPU's fusion repeats a producer
  in its readers only where it reads no more than it writes (a broadcast,
  a unary function) or can be fused along every path to them. So an
  elementwise value with larger operands (``x * scale``) that both passes
  read is made apart and kept from the forward pass to the backward; and
  a broadcast both passes make of one value to one shape is one value to
  XLA's CSE, made apart, where an equation of broadcasts alone (an RMS
  norm's ``rsqrt(var) * scale``) reads it. Remat keeps the passes apart:
  its backward block reads its inputs through an optimization barrier,
  behind which XLA merges nothing with the forward pass. Without these,
  a Griffin-style recurrent LM was estimated 9-12% under its compiled
  peak without remat and under ``dots_saveable``, and 4.6% over under
  ``everything_saveable``, which compiles 13-16% lower than both: the
  estimate ordered them the other way.

* **Recompute fused into the backward pass** (CPU). Of remat's recompute,
  the elementwise work whose values reach only the backward pass (through
  fusing equations: no recomputed matmul reads them) is fused into the
  backward pass's fusions, computed again in each; for the rule above
  such a reader is the backward pass's. Under ``dots_saveable`` a
  Griffin-style LM's gelu product is computed again from the saved matmul
  output and the recomputed ``tanh`` in every backward fusion that reads
  it; without remat, and under ``nothing_saveable`` (a recomputed matmul
  reads it, and XLA:CPU merges that recompute with the forward pass), the
  forward pass reads it too and it is made apart, one buffer per block.
  Without this rule the estimate gave ``nothing_saveable`` and both dots
  policies one figure where they compile 2.4-2.7% apart;
  ``bench/estimates.py`` counted 15 pairs of policies that compile more
  than 1% apart given one figure, 6 with it.

* **Broadcasts a dot's fusion reads** (CPU). XLA:CPU fuses a dot with
  the elementwise work on its result, and such a fusion reads a broadcast
  operand made apart, full size. Where the backward pass's dot fusion and
  the forward pass broadcast one value to one shape (a softmax's
  denominator: ``exp / sum`` forward, the dot ``g @ v`` divided by the same
  sum backward), XLA's CSE makes the two one buffer, made in the forward
  pass and kept for the backward. Without this rule the estimate of the
  example transformer over 512 tokens was 23-26% under its compiled peaks
  (a 32 MiB broadcast per layer), and ordered ``everything_saveable``,
  which compiles 23% lower, above the other policies.

* **Recompute run early** (CPU). Remat's recompute outside a loop waits
  only for its inputs: the barrier that keeps XLA from merging it with the
  forward pass does not tie it to the backward pass, and XLA:CPU's
  scheduler runs it with the forward pass, keeping its results from then
  on (inside a loop body it runs at the start of each iteration). Measured
  on the example transformer, unrolled: ``nothing_saveable`` compiles to
  the same peak as no remat on the CPU.

* **The forward pass in depth-first order** (CPU). XLA:CPU schedules a
  program with XLA's depth-first memory scheduler: a post-order walk from
  the outputs that visits first, of an instruction's operands, the one
  whose subgraph holds the most readers beyond each value's first, then
  the most bytes. Walked so on the jaxpr, the forward pass of a remat'ed
  LM runs the layers' recompute before the loss's head makes its logits,
  as XLA:CPU's compiled Flax BERT does (the recompute is live with the
  logits at its peak). In program order it came after the head: Hugging
  Face's Flax BERT (``bench/estimates.py --only bert``) was estimated
  13.9-18.4% under its compiled peaks under ``nothing_saveable`` and both
  dots policies, and ``everything_saveable``, which compiles 11.8% below
  ``dots_with_no_batch_dims_saveable``, above them; in this order it is
  within 7.9% and ordered as compiled. The backward pass keeps program
  order: walked depth-first on the jaxpr, where XLA walks fused
  instructions, it interleaved the backward blocks of several layers and
  put the example convnet 40% over.

* **Values read through remat's barrier** (GPU). Remat's backward block
  reads its inputs through an optimization barrier, and XLA:GPU makes each
  value it reads there apart: under ``everything_saveable`` a gelu's four
  intermediates are four buffers per layer, where without remat XLA:GPU
  computes them again inside the backward pass's fusions. Without this
  rule the estimate gave both one figure, where ``everything_saveable``
  compiles 14-100% above no remat (a Griffin-style LM 41% under); with it,
  within 20% of every model's compiled peak. XLA:CPU does not: the rule
  put its estimates of the example transformer 41% over.

* **Loop slices read through remat's barrier** (GPU). The same holds in a
  ``scan`` body: a slice of the loop's stacked inputs (a layer's saved
  residuals) that the backward block reads through its barrier is a
  buffer of the body's, made when the iteration starts. Without this rule
  the Flax NNX and Equinox transformers (layers scanned, blocks remat'ed)
  were estimated 14-20% under the H100's compiled peak under
  ``everything_saveable``, and below no remat, which compiles 12-14% lower.
  It is kept to slices that something other than a matmul reads there:
  counted for every slice, those models' ``nothing_saveable`` (whose
  blocks read their weights' slices through the barrier) went 10-14%
  over their compiled peaks.

* **Nothing written over a value read through remat's barrier** (GPU).
  A value the backward block reads through its barrier keeps its buffer
  until it dies: XLA:GPU writes no fusion's output over it (a relu's
  gradient goes into a buffer of its own, not over the cotangent it reads
  there). Without this rule a convnet's policies that remat something were
  estimated one activation (0.5 MiB, 14-20%) under the H100's compiled
  peak, written channels-last (the example) or channels-first, and
  ``dots_saveable`` was given no remat's figure, though it compiles 12-16%
  higher. (A rule that kept it to fusions with a reduction, a relu's
  gradient with the bias gradient summed from it, covered the
  channels-last convnet alone.)

* **Cheap values made late** (GPU). Of the values remat's backward block
  reads through its barrier, one that only the backward pass reads and
  that is cheap elementwise work on values the backward pass reads anyway
  (a derivative's coefficient: ``3 * x**2`` for a gelu's ``x**3``,
  ``2 * (x - mean)`` for a layer norm's square) is a fusion of its own,
  which XLA:GPU's scheduler runs just before the backward pass reads it:
  at the end of the forward pass only the last layer's is live. A cheap
  reader of a transcendental of its shape (``1 - tanh``) is not: XLA:GPU
  computes it in the transcendental's fusion, as another output. Without
  this rule the unrolled example transformer's ``everything_saveable``
  was estimated 19.5% over the H100's compiled peak (10% with it alone).
  It is not always so: in the Griffin-style LM of
  ``tests/framework_models.py`` XLA:GPU computes the narrower blocks'
  coefficients in the forward pass, inside fusions with the transposes
  the recurrence reads (``loop_multiply_subtract_transpose_fusion``), and
  the rule puts its ``everything_saveable`` 9.4% under (1.3% over
  without it).

* **Equal values merged** (GPU). XLA's CSE makes one value of elementwise
  equations that compute the same thing from the same operands (JAX
  computes a layer norm's ``x - mean`` twice, for the variance and for
  the result); a value read through remat's barrier is another operand
  than the same value outside it. With the rule above it puts the unrolled
  transformer's ``everything_saveable`` 4.6% over (0.5% over 512 tokens,
  13.8% before both), and recurrentgemma's Griffin 0.4% (7.7% before). On
  the CPU, whose rules were read without it, it put the unrolled
  transformer 4.8-7.8% under its compiled peaks instead of within 3.5%:
  kept to the GPU.

* **What a gather reads** (GPU). XLA:GPU fuses the elementwise work that
  makes a gather's operand into the gather, which computes only the
  elements it takes: the log-probabilities a language model's loss takes
  at its targets (``take_along_axis`` of ``log_softmax``) are never a
  buffer. XLA:CPU makes them (an estimate with this rule was 29% under
  its compile of such a loss). Without it, Hugging Face's Flax BERT-base
  (``transformers`` 4.46, 12 layers, 8 x 512 tokens, a 30,522-word
  vocabulary) was estimated 2-30% over the compile-only H100's peaks
  (``nothing_saveable`` 2,584 MiB against 1,993); with it, 1.9-5.7%.

* **Tiles** (TPU). XLA:TPU stores an array in tiles: its minor dimension
  padded to a multiple of 128, its second-minor one to a multiple of 8
  (to 1, 2 or 4 where it is that small); a vector or a scalar in 128,
  256, 512 or a multiple of 1024 32-bit words. Its layout assignment puts
  the dimensions that pad least in those two places (an ``f32[4, 64, 32]``
  argument is stored as 4 x 32 x 128, twice its bytes); the model takes
  every value so. Read off the argument sizes XLA:TPU compiles for
  ``v5e``; without it, the estimate for one ``v5e`` device was 69-86%
  under the example convnet's compiled peak (its 16 channels take 128).

**Other platforms** get the model without the CPU's rules: XLA:GPU's and
XLA:TPU's schedulers run the recompute where the backward pass reads it,
as the jaxpr orders it (``nothing_saveable`` compiles the same transformer
for a compile-only H100 to half its peak without remat). The generic model
was measured against compile-only H100s (``bench/estimates.py --target
h100``). On TPUs it is not near: XLA:TPU fuses far more (it compiles the
512-token transformer without remat to 119 MiB, less than its four
layers' attention probabilities take, 128 MiB), so an estimate for a TPU
carries a note saying so.

Not modelled: a ``scan`` body's slices of its stacked inputs. XLA slices
them in the body, and a slice a matmul reads is a buffer of its own; but
XLA also orders the body so that such a slice dies early, where the model
keeps the jaxpr's order, and counting the slices without that order put
the scanned MLP's estimate 3% over its compiled peak instead of on it.
Nor are the partial sums of a matmul XLA:GPU splits along its contracting
dimension (Triton's split-K: ``f32[8,512,128]`` for a ``[512,128]``
product), most of what the scanned transformer's estimate misses under the
matmul policies (10-16% under): how far XLA splits follows its tiling
heuristics, not the jaxpr, and it splits small products only (a
``[768,3072]`` product over 8,192 tokens is not split).
Nor are XLA:CPU's YNNPACK reductions: a float32 sum, max or min over
4,096 elements or more is a ``ynn_fusion`` of its own, which makes apart
a value that something else reads too (the loss ``sum(relu(y) ** 2)``
makes ``relu(y)`` apart, its gradient computes it again from ``y``) and
any broadcast it reads, full size. That value is what the channels-first
convnet's estimate misses (10.9-12.2% under): the loss's sum, which
nothing else reads, is scheduled into the backward pass, and the value
lives until then. A rule for the first half, with the value's operands
kept for its other readers, brought that model's no-remat estimate to
0.4% under, but gave no remat and ``nothing_saveable`` one figure where
they compile 12% apart, and moved the example convnet from its compiled
peak to 3.4% over; one that had the value die with the reduction,
computed again in its other readers as XLA compiles it, left the
channels-first convnet where it was (the late sum not modelled) and the
example convnet 3.4% over: neither kept. (The first, with a layout copy
counted as a reader of the value it copies, as XLA's fusion sees it,
leaves the example convnet at its compiled peak and brings the
channels-first one within 0.4% without remat and under ``dots_saveable``
and ``everything_saveable``, but still gives no remat and
``nothing_saveable`` one figure: under ``nothing_saveable`` XLA also
keeps the last block's forward ``y`` into the backward pass, where the
loss's gradient computes ``relu(y)`` again from it, while the rule has
the gradient read the value made apart.)
They are also what sets Flax BERT's ``dots_with_no_batch_dims_saveable``
32 MiB above its other policies: the recompute, run with the forward pass,
makes each layer's softmax denominator's reciprocal broadcast full size
for the backward pass's row-sum reduction, and it lives until then.
Nor is where XLA:CPU schedules a loss's gradient seed. In Flax BERT the
scatter that ``take_along_axis``'s gradient makes (``f32[8,256,8192]``,
64 MiB) reads only the token ids and a constant, and XLA:CPU makes it at
step 107 of 603, in the forward pass, so that it is live with the LM
head's logits and their ``exp`` at the compiled peak (step 334); the
model makes it where the backward pass starts. With the forward pass in
depth-first order the estimate's peak holds as many buffers of that size
(the logits, their ``exp`` and ``x - max``), but not the scatter. Two
rules tried for it, against the forward pass in program order: moving the
loss's own forward equations (those only the returned loss reads) after
the backward pass brought BERT within 7.9%, but put Equinox's dots
policies 8.5-10.5% over (4.7-6.3% then); making such scatters as early as
their operands allow left BERT where it was (the jaxpr computes the
indices after the logits) and put other models up to 19.7% over, where
XLA does not make them early: neither kept.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from jax.extend.core import JaxprEqn

from remat_explorer.analysis.units import aval_bytes


@dataclass(frozen=True)
class Backend:
  """The rules above that hold on one platform."""
  platform: str
  convolution_layouts: bool
  reductions_fuse_minor_broadcasts: bool
  repeats_cheap_values: bool
  loop_state_made_first: bool
  materialises_values_both_passes_read: bool
  fuses_recompute_into_backward: bool
  dot_fusions_read_broadcasts_apart: bool
  runs_recompute_early: bool
  forward_in_depth_first_order: bool
  materialises_values_read_through_barriers: bool
  materialises_slices_read_through_barriers: bool
  makes_cheap_barrier_reads_late: bool
  merges_equal_values: bool
  writes_apart_from_barrier_reads: bool
  stores_in_tiles: bool
  fuses_gather_operands: bool

  def stored_bytes(self, aval) -> int:
    """Bytes a value of abstract value `aval` takes on this platform."""
    return tiled_bytes(aval) if self.stores_in_tiles else aval_bytes(aval)


def backend_of(platform: str) -> Backend:
  """The rules of `platform` ('cpu', 'gpu', 'tpu', ...); where none was read,
  the model's generic one (no layout copies, reductions fuse everything)."""
  cpu = platform == 'cpu'
  return Backend(platform=platform, convolution_layouts=cpu,
                 reductions_fuse_minor_broadcasts=not cpu, repeats_cheap_values=cpu,
                 loop_state_made_first=cpu, materialises_values_both_passes_read=cpu,
                 fuses_recompute_into_backward=cpu,
                 dot_fusions_read_broadcasts_apart=cpu,
                 runs_recompute_early=cpu, forward_in_depth_first_order=cpu,
                 materialises_values_read_through_barriers=platform == 'gpu',
                 materialises_slices_read_through_barriers=platform == 'gpu',
                 makes_cheap_barrier_reads_late=platform == 'gpu',
                 merges_equal_values=platform == 'gpu',
                 writes_apart_from_barrier_reads=platform == 'gpu',
                 stores_in_tiles=platform == 'tpu',
                 fuses_gather_operands=platform == 'gpu')


GENERIC = backend_of('')


_LANES = 128  # a tile's minor dimension
_VECTOR_TILES = (128, 256, 512)  # then multiples of 1024


def tiled_bytes(aval) -> int:
  """Bytes of `aval` stored in XLA:TPU's tiles, its dimensions placed where
  they pad least (see the module)."""
  logical = aval_bytes(aval)
  if not logical:  # no data (a token), or an empty array
    return 0
  shape = tuple(int(d) for d in aval.shape)
  item = logical // math.prod(shape)
  if len(shape) <= 1:  # in 32-bit words, narrower elements packed
    words = -(-logical // 4)
    return next((t for t in _VECTOR_TILES if words <= t), _padded(words, 1024)) * 4
  return item * min(
      math.prod(d for i, d in enumerate(shape) if i not in (minor, second))
      * _padded(shape[second], _second_minor_tile(shape[second]))
      * _padded(shape[minor], _LANES)
      for minor, second in itertools.permutations(range(len(shape)), 2))


def _second_minor_tile(n: int) -> int:
  return next((t for t in (1, 2, 4) if n <= t), 8)


def _padded(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def convolution_operands_to_copy(eqn: JaxprEqn) -> list[int]:
  """Positions of a convolution's operands that are not in the order XLA:CPU
  runs convolutions in (see the module)."""
  if eqn.primitive.name != 'conv_general_dilated':
    return []
  numbers = eqn.params['dimension_numbers']
  lhs, rhs = numbers.lhs_spec, numbers.rhs_spec
  n = len(lhs)
  # lhs_spec: (batch, feature, spatial...), rhs_spec: (out, in, spatial...),
  # each the operand's dimension that holds it.
  image_in_order = tuple(lhs) == (0, n - 1, *range(1, n - 1))
  kernel_in_order = tuple(rhs) == (n - 1, n - 2, *range(n - 2))
  return [i for i, in_order in enumerate((image_in_order, kernel_in_order))
          if not in_order]


def reads_minor_broadcast(eqn: JaxprEqn, operand_makers) -> bool:
  """Whether `eqn` reads an operand broadcast along its result's minor
  (last) dimension: one whose last dimension of size 1 the equation
  stretches (``x - mean`` with ``mean`` of shape ``(..., 1)``), or one made
  by a ``broadcast_in_dim`` that adds that dimension. `operand_makers`: the
  equation that made each operand (None for an input)."""
  shape = getattr(eqn.outvars[0].aval, 'shape', ())
  if not shape:
    return False
  for var, maker in zip(eqn.invars, operand_makers):
    operand = getattr(var.aval, 'shape', ())
    if len(operand) == len(shape) and operand[-1] == 1 < shape[-1]:
      return True
    if maker is not None and maker.primitive.name == 'broadcast_in_dim':
      dims = maker.params['broadcast_dimensions']
      made = maker.outvars[0].aval.shape
      if dims and (len(made) - 1) not in dims and made[-1] > 1:
        return True
  return False
