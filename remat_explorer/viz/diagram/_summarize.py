"""Keeping a split diagram under a node budget, without hiding its shape.

Applied in this order by ``split_graph.split_diagram`` once a diagram has too
many nodes (blocks whose splits are alike are drawn once already); runs of
equations that repeat with a period, such as the layers of an unrolled
model, drawn once with ×N (``fold_repeats``); chains of elementwise ops
folded (``fold_chains``); and what still does not fit elided into "⋯ N more"
nodes from the middle of a program, so that its inputs and outputs stay in
view (``elide``). Edges follow the nodes that absorb others
(``Diagram.redirect``), so data flow stays drawn.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from remat_explorer.viz.diagram._graph import Diagram, Node, Section
from remat_explorer.viz.text import format_flops


def fold_repeats(diagram: Diagram, *, min_repeats: int = 3,
                 max_period: int = 512) -> None:
  """Fold each run of equations that repeats with a period into one node.

  An unrolled model's layers are the same few equations over and over:
  drawn once with ×N they keep the picture's shape where eliding would cut
  most of it. Equations match when their primitive, output types and
  recompute status do (``checkpoint_name``s may differ: each layer's names
  are listed in the folded node's tooltip).
  """
  moved = {}
  for section in diagram.sections():
    nodes = list(section.nodes.values())
    body = [n for n in nodes if n.kind in ('eqn', 'sub', 'group')]
    runs = _periodic_runs([_signature(n) for n in body], min_repeats, max_period)
    if not runs:
      continue
    first_of_run = {}
    for start, period, repeats in runs:
      segment = body[start:start + period * repeats]
      stand_in = _repeat_node(f'{section.id}_rep{start}', segment, period, repeats)
      first_of_run[segment[0].id] = stand_in
      moved.update((n.id, stand_in.id) for n in segment)
    new_nodes = {}
    for node in nodes:
      if node.id in first_of_run:
        stand_in = first_of_run[node.id]
        new_nodes[stand_in.id] = stand_in
      elif node.id not in moved:
        new_nodes[node.id] = node
    section.nodes = new_nodes
  if moved:
    diagram.redirect(moved)


def _signature(node: Node) -> tuple:
  return (node.kind, node.lines[0] if node.kind == 'eqn' else tuple(node.lines),
          node.lines[-1], node.recomputed, node.name is not None)


def _periodic_runs(signatures: list, min_repeats: int,
                   max_period: int) -> list[tuple[int, int, int]]:
  """Non-overlapping ``(start, period, repeats)`` runs of `signatures` that
  repeat at least `min_repeats` times, the ones covering most taken first."""
  if len(signatures) < 2 * min_repeats:
    return []
  codes = {}
  seq = np.array([codes.setdefault(s, len(codes)) for s in signatures])
  candidates = []
  for period in range(1, min(max_period, len(seq) // min_repeats) + 1):
    same = np.concatenate([[False], seq[period:] == seq[:-period], [False]])
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    for start, stop in zip(edges[::2], edges[1::2]):
      # seq[start:stop + period] repeats with this period.
      repeats = (stop - start + period) // period
      if repeats >= min_repeats:
        candidates.append((repeats * period, period, int(start), int(repeats)))
  candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
  taken, covered = [], np.zeros(len(seq), dtype=bool)
  for length, period, start, repeats in candidates:
    if not covered[start:start + length].any():
      covered[start:start + length] = True
      taken.append((start, period, repeats))
  return sorted(taken)


def _repeat_node(nid: str, segment: list[Node], period: int, repeats: int) -> Node:
  one = [n.lines[0] for n in segment[:period]]
  shown = ' → '.join(one) if period <= 4 else ' → '.join(one[:3]) + f' → … ({period} ops)'
  recomputed = sum(n.recomputed_equations for n in segment)
  names = [n.name for n in segment if n.name is not None]
  total = sum(n.equations for n in segment)
  lines = [f'{shown} ×{repeats}', segment[period - 1].lines[-1]]
  if 0 < recomputed < total:
    lines.append(f'{recomputed} of {total} recomputed')
  return Node(nid, lines, 'folded', recomputed=recomputed == total,
              flops=sum(n.flops for n in segment), equations=total,
              recomputed_equations=recomputed, names=names)


def fold_chains(diagram: Diagram) -> None:
  """Fold each chain of elementwise one-in-one-out ops into one node.

  A value inside a chain has exactly one consumer (the next op), so folding
  hides no data flow; residual producers and named values end chains.
  """
  out_degree, in_data = defaultdict(int), defaultdict(list)
  for e in diagram.edges:
    out_degree[e.src] += 1
    if e.kind == 'data':
      in_data[e.dst].append(e.src)
  moved = {}
  for section in diagram.sections():
    chains, current = [], []
    for node in section.nodes.values():
      if not (node.kind == 'eqn' and node.foldable):
        current = []
        continue
      prev = current[-1] if current else None
      if (prev is not None and in_data[node.id] == [prev.id]
          and out_degree[prev.id] == 1 and prev.recomputed == node.recomputed):
        current.append(node)
      else:
        current = [node]
        chains.append(current)
    for chain in (c for c in chains if len(c) > 1):
      head = chain[0]
      head.kind, head.lines = 'folded', [_chain_label(chain), chain[-1].lines[-1]]
      head.flops = sum(n.flops for n in chain)
      head.equations = sum(n.equations for n in chain)
      head.recomputed_equations = sum(n.recomputed_equations for n in chain)
      for n in chain[1:]:
        moved[n.id] = head.id
        del section.nodes[n.id]
  if moved:
    diagram.redirect(moved)


def _chain_label(chain: list[Node]) -> str:
  prims = [n.lines[0] for n in chain]
  for period in range(1, min(6, len(prims)) + 1):
    if len(prims) % period == 0 and prims == prims[:period] * (len(prims) // period):
      repeats = len(prims) // period
      return ' → '.join(prims[:period]) + (f' ×{repeats}' if repeats > 1 else '')
  return ' → '.join(prims[:3]) + ' → … → ' + prims[-1] + f' ({len(prims)} ops)'


def elide(diagram: Diagram, budget: int) -> None:
  """Elide nodes until the diagram has at most about `budget` nodes.

  Each section gets a share by water-filling (small sections keep all their
  nodes); a section over its share keeps some inputs, some outputs, and the
  head and tail of its equations, the rest merged into "⋯ N more" nodes.
  """
  sections = [s for s in diagram.sections() if s.nodes]
  if sum(len(s.nodes) for s in sections) <= budget:
    return
  shares, left = {}, max(budget, len(sections))
  for i, s in enumerate(sorted(sections, key=lambda s: len(s.nodes))):
    shares[s.id] = min(len(s.nodes), max(1, left // (len(sections) - i)))
    left -= shares[s.id]
  moved = {}
  for s in sections:
    if len(s.nodes) > shares[s.id]:
      moved.update(_elide_section(s, shares[s.id]))
  diagram.redirect(moved)


def _elide_section(section: Section, share: int) -> dict[str, str]:
  nodes = list(section.nodes.values())
  if share < 4:
    segments = [('body', [], nodes, [])]
  else:
    groups = {'input': [n for n in nodes if n.kind == 'input'],
              'output': [n for n in nodes if n.kind == 'output']}
    body = [n for n in nodes if n.kind not in groups]
    segments, left = {}, share
    for kind, fraction in (('input', 4), ('output', 8)):
      group = groups[kind]
      keep = len(group) if len(group) <= share // fraction else max(0, share // fraction - 1)
      left -= keep + (keep < len(group))
      segments[kind] = (kind, group[:keep], group[keep:], [])
    if len(body) <= left:
      segments['body'] = ('body', body, [], [])
    else:
      keep = max(0, left - 1)
      head, tail = (keep + 1) // 2, keep // 2
      segments['body'] = ('body', body[:head], body[head:len(body) - tail],
                          body[len(body) - tail:])
    segments = [segments[k] for k in ('input', 'body', 'output')]
  new_nodes, moved = {}, {}
  for kind, head, gone, tail in segments:
    new_nodes.update((n.id, n) for n in head)
    if gone:
      stand_in = _stand_in(section, kind, gone)
      new_nodes[stand_in.id] = stand_in
      moved.update((n.id, stand_in.id) for n in gone)
    new_nodes.update((n.id, n) for n in tail)
  section.nodes = new_nodes
  return moved


def _stand_in(section: Section, kind: str, gone: list[Node]) -> Node:
  nid = f'{section.id}_more_{kind}'
  what = {'input': 'inputs', 'output': 'outputs', 'body': 'equations'}[kind]
  equations = sum(n.equations for n in gone)
  lines = [f'⋯ {equations if kind == "body" else len(gone)} more {what}']
  recomputed = sum(n.recomputed_equations for n in gone)
  flops = sum(n.flops for n in gone)
  if kind == 'body':
    lines.append(format_flops(flops))
    if recomputed:
      lines.append(f'{recomputed} recomputed')
  return Node(nid, lines, 'elided', flops=flops, equations=equations,
              recomputed_equations=recomputed)
