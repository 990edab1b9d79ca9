// The split-diagram viewer: a Graphviz SVG shown whole where its text stays
// readable (else from its start), panned and zoomed with d3-zoom (wheel,
// drag, the toolbar, a minimap), searched by name, module or source line,
// in the Explorer widget and in the static report alike. viewer.py puts
// this file after the d3 modules it loads (`d3` below), viewer_search.js
// and viewer_minimap.js, and adds the entry point of each use.

const SVG_NS = 'http://www.w3.org/2000/svg';
const MAX_ZOOM = 8;  // times the natural size
const MARGIN = 8;  // px around the diagram in the initial and fitted views
const MIN_TEXT_PX = 11;  // the smallest text at the opening zoom, at least

// Graphviz sizes its SVG in points over a viewBox of the same numbers: the
// natural scale (CSS px per viewBox unit) is 4/3, where its 9-11 pt labels
// are 12-15 px on screen. Read from the attributes rather than assumed.
function naturalGeometry(svg) {
  const box = svg.viewBox && svg.viewBox.baseVal;
  const px = (name) => {
    const text = svg.getAttribute(name) || '';
    const value = parseFloat(text);
    if (!(value > 0)) return NaN;
    return text.endsWith('pt') ? value * 4 / 3 : value;
  };
  const width = box && box.width > 0 ? box.width : px('width') || 600;
  const height = box && box.height > 0 ? box.height : px('height') || 400;
  const scale = px('width') / width;
  return {width, height, scale: scale > 0 ? scale : 1};
}

function button(label, title, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'remat-viewer-button';
  b.textContent = label;
  b.title = title;
  b.addEventListener('click', onClick);
  return b;
}

// The smallest text of the drawing, in its own units: Graphviz writes each
// <text>'s font-size in points, the viewBox's unit. Infinity without text.
function smallestFont(svg) {
  let smallest = Infinity;
  for (const t of svg.querySelectorAll('text')) {
    const size = parseFloat(t.getAttribute('font-size') || t.style.fontSize);
    if (size > 0 && t.textContent.trim()) smallest = Math.min(smallest, size);
  }
  return smallest;
}

// `element`'s bounding box in the units of `layer` (the drawing's, before
// the zoom), or null where it is not laid out (a hidden tab).
function boxIn(layer, element) {
  const outer = layer.getCTM(), inner = element.getCTM();
  if (!outer || !inner) return null;
  const b = element.getBBox();
  const m = outer.inverse().multiply(inner);
  // Graphviz transforms only translate and scale: two corners suffice.
  const xs = [b.x * m.a + b.y * m.c + m.e, (b.x + b.width) * m.a + (b.y + b.height) * m.c + m.e];
  const ys = [b.x * m.b + b.y * m.d + m.f, (b.x + b.width) * m.b + (b.y + b.height) * m.d + m.f];
  return {x: Math.min(...xs), y: Math.min(...ys), width: Math.abs(xs[1] - xs[0]),
          height: Math.abs(ys[1] - ys[0])};
}

// What a click acts on (a node that opens, an opened group, which closes)
// as tab stops in the drawing's order, each named by its text.
function reachableByKeyboard(layer) {
  for (const g of layer.querySelectorAll('g.node.opens, g.cluster.closes')) {
    const text = Array.from(g.querySelectorAll(':scope > text, :scope > g text'),
                            (t) => t.textContent.trim()).filter(Boolean).join(' \u00b7 ');
    g.setAttribute('tabindex', '0');
    g.setAttribute('role', 'button');
    g.setAttribute('aria-label', `${text} (${g.classList.contains('closes') ? 'close' : 'open'})`);
  }
}

// Mounts a viewer in `host`; returns {show(svg), fit(), natural(), destroy()}.
// `show` takes SVG text or an <svg> element already in the page.
// `onClick(id)` gets the id of a clicked Graphviz node (<g class="node">);
// a drag that ends on a node is not a click (d3-zoom swallows it). `focus`:
// the title of the cluster where the drawing starts (its top left is shown
// first when the whole drawing is too big to read).
function mountViewer(host, {onClick, focus = 'cluster_forward'} = {}) {
  host.classList.add('remat-viewer');
  const bar = document.createElement('div');
  bar.className = 'remat-viewer-bar';
  const stage = document.createElement('div');
  stage.className = 'remat-viewer-stage';
  // Enter and Space on a node in focus click it, not JupyterLab's shortcuts.
  stage.setAttribute('data-lm-suppress-shortcuts', 'true');
  const readout = document.createElement('span');
  readout.className = 'remat-viewer-zoom';
  let current = null;  // {svg, layer, zoom, geometry}
  // How a new drawing (show) or a new stage size is placed. 'open': the
  // opening view below; 'fit': the whole drawing (the fit button);
  // 'moved': the user's own zoom and position, kept as they are (clamped to
  // the drawing) when `svg` changes, as it does at each policy, lowering or
  // block picked: the user looks at the same place of the new drawing. A
  // wheel, a drag, the 100%, + and − buttons, the minimap and the search
  // all count as moving it.
  let mode = 'open';

  const stageSize = () => ({width: stage.clientWidth, height: stage.clientHeight});

  // Where the drawing starts, in its units: the top left of the `focus`
  // cluster (the forward pass, the start of the program), with the title
  // where it is near enough to fit in the same view at zoom `k`.
  const startPoint = (k) => {
    const {width, height} = stageSize();
    const title = Array.from(current.layer.querySelectorAll('g.cluster > title'))
        .find((t) => t.textContent === focus);
    const start = (title && boxIn(current.layer, title.parentNode)) || {x: 0, y: 0};
    const label = current.layer.querySelector(':scope > g.graph > text');
    const head = label && boxIn(current.layer, label);
    if (head && head.x < start.x && (start.x - head.x) * k <= width / 2) start.x = head.x;
    if (head && head.y < start.y && (start.y - head.y) * k <= height / 2) start.y = head.y;
    return start;
  };

  // The transform that shows the drawing at zoom `k` from its start:
  // centred across where it fits the width.
  const fromStart = (k) => {
    const g = current.geometry, {width} = stageSize(), p = startPoint(k);
    const x = g.width * k <= width ? (width - g.width * k) / 2
                                   : MARGIN - Math.max(0, p.x * k - 3 * MARGIN);
    const y = MARGIN - Math.max(0, p.y * k - 5 * MARGIN);
    return d3.zoomIdentity.translate(x, y).scale(k);
  };

  const centred = (k) => {
    const g = current.geometry, {width, height} = stageSize();
    return d3.zoomIdentity.translate((width - g.width * k) / 2,
                                     Math.max((height - g.height * k) / 2, MARGIN)).scale(k);
  };

  // 'fit': the whole drawing, up to its natural size, whatever its text
  // size. 'natural': 100%. 'open': the largest zoom that shows the whole
  // drawing (up to its natural size), unless its smallest text would be
  // under MIN_TEXT_PX: then that text at MIN_TEXT_PX, from the start.
  const transformFor = (which) => {
    const g = current.geometry, {width, height} = stageSize();
    const whole = Math.min((width - 2 * MARGIN) / g.width, (height - 2 * MARGIN) / g.height);
    if (which === 'fit') return centred(Math.min(whole, g.scale));
    if (which === 'natural') return fromStart(g.scale);
    const k = Math.min(whole, Math.max(g.scale, g.readable));
    return k >= g.readable ? centred(k) : fromStart(g.readable);
  };

  // `t` within the zoom's scale extent (about the stage's centre) and the
  // drawing kept on the stage: a drawing smaller than the stage wholly in
  // it, a larger one covering it, a margin at its edges.
  const clamped = (t) => {
    const g = current.geometry, {width, height} = stageSize();
    const [least, most] = current.zoom.scaleExtent();
    const k = Math.min(most, Math.max(least, t.k));
    const within = (v, size, extent) => {
      const a = MARGIN, b = extent - size * k - MARGIN;
      return Math.min(Math.max(a, b), Math.max(Math.min(a, b), v));
    };
    const x = width / 2 - (width / 2 - t.x) * k / t.k;
    const y = height / 2 - (height / 2 - t.y) * k / t.k;
    return d3.zoomIdentity.translate(within(x, g.width, width), within(y, g.height, height))
        .scale(k);
  };

  // Show transform `t`, clamped once the stage has a size.
  const apply = (t) => {
    if (!current) return;
    d3.select(current.svg).call(current.zoom.transform, stage.clientWidth ? clamped(t) : t);
  };
  const place = (which) => {
    if (current && stage.clientWidth) apply(transformFor(which));
  };
  const moveTo = (t) => {
    mode = 'moved';
    apply(t);
  };
  // Centre the view on point (x, y) of the drawing, at zoom `k`.
  const centreOn = (x, y, k) => {
    const {width, height} = stageSize();
    moveTo(d3.zoomIdentity.translate(width / 2 - x * k, height / 2 - y * k).scale(k));
  };
  const zoomNow = () => d3.zoomTransform(current.svg).k;

  const zoomBy = (factor) => {
    if (!current) return;
    mode = 'moved';
    d3.select(current.svg).call(current.zoom.scaleBy, factor);
  };
  bar.append(
      button('fit', 'Zoom out to show the whole diagram', () => {
        mode = 'fit';
        place('fit');
      }),
      button('100%', 'Natural size: labels as Graphviz set them', () => {
        if (current) moveTo(transformFor('natural'));
      }),
      button('+', 'Zoom in', () => zoomBy(1.25)),
      button('\u2212', 'Zoom out', () => zoomBy(0.8)),
      readout);
  const search = mountSearch(bar, {
    stage,
    // The legend's samples are not the program's.
    nodes: () => (current ? Array.from(current.layer.querySelectorAll('g.node'))
        .filter((n) => !n.id.startsWith('legend_')) : []),
    goTo: (node) => {
      const box = boxIn(current.layer, node);
      if (box) centreOn(box.x + box.width / 2, box.y + box.height / 2,
                        Math.max(zoomNow(), current.geometry.readable));
    },
  });
  const help = document.createElement('span');
  help.className = 'remat-viewer-help';
  help.textContent = 'wheel: zoom \u00b7 drag: pan';
  bar.append(help);
  host.replaceChildren(bar, stage);
  const minimap = mountMinimap(stage, (x, y) => current && centreOn(x, y, zoomNow()));

  // A viewer mounted in a hidden tab has no size yet: the view is placed
  // when it gets one, and again on resizes unless the user moved it.
  const resized = new ResizeObserver(() => {
    if (!current || !stage.clientWidth) return;
    if (mode === 'moved') apply(d3.zoomTransform(current.svg));
    else place(mode);
  });
  resized.observe(stage);

  stage.addEventListener('click', (event) => {
    // A node, or an opened group's cluster (a click on it closes the group).
    const node = event.target.closest && event.target.closest('g.node, g.cluster');
    if (node && node.id && onClick) onClick(node.id);
  });
  // The keyboard's click: Enter or Space on a node or group in focus.
  stage.addEventListener('keydown', (event) => {
    if (event.key !== 'Enter' && event.key !== ' ') return;
    const node = event.target.closest && event.target.closest('g[tabindex]');
    if (!node || !onClick) return;
    event.preventDefault();
    onClick(node.id);
  });
  // A node reached with Tab outside the view is brought to its centre.
  stage.addEventListener('focusin', (event) => {
    const node = event.target.closest && event.target.closest('g[tabindex]');
    if (!node || !current) return;
    const shown = stage.getBoundingClientRect(), r = node.getBoundingClientRect();
    if (r.left >= shown.left && r.right <= shown.right && r.top >= shown.top
        && r.bottom <= shown.bottom) return;
    const box = boxIn(current.layer, node);
    centreOn(box.x + box.width / 2, box.y + box.height / 2, zoomNow());
  });

  function show(source) {
    const before = current && d3.zoomTransform(current.svg);
    minimap.clear();
    stage.replaceChildren();
    readout.textContent = '';
    current = null;
    const nothing = (why) => {
      stage.textContent = why;
      search.refresh();  // the old drawing's matches are gone
    };
    let svg = source;
    if (typeof source === 'string') {
      if (!source.trim()) return nothing('no diagram');
      const doc = new DOMParser().parseFromString(source, 'image/svg+xml');
      svg = doc.documentElement;
      if (svg.nodeName !== 'svg') return nothing('the diagram could not be read');
      svg = document.importNode(svg, true);
    }
    // The minimap's image: the drawing as it came, before the changes below.
    const standalone = typeof source === 'string' ? source
                                                  : new XMLSerializer().serializeToString(svg);
    const geometry = naturalGeometry(svg);
    // The zoom at which the smallest text is MIN_TEXT_PX, rounded up.
    geometry.readable = Math.ceil(1e4 * MIN_TEXT_PX / smallestFont(svg)) / 1e4 || 0;
    // The zoom transform works in CSS px: the SVG fills the stage and its
    // content goes in one layer that d3-zoom transforms.
    svg.removeAttribute('viewBox');
    svg.setAttribute('width', '100%');
    svg.setAttribute('height', '100%');
    const layer = document.createElementNS(SVG_NS, 'g');
    layer.setAttribute('class', 'remat-zoom-layer');
    while (svg.firstChild) layer.appendChild(svg.firstChild);
    svg.appendChild(layer);
    // As tall as the diagram at its natural size, up to most of the window.
    const tall = geometry.height * geometry.scale + 2 * MARGIN;
    stage.style.height = `${Math.round(Math.min(tall, Math.max(320, 0.75 * window.innerHeight)))}px`;
    stage.appendChild(svg);
    minimap.show(standalone, geometry);
    if (onClick) reachableByKeyboard(layer);

    const zoom = d3.zoom()
        .scaleExtent([geometry.scale / 50, geometry.scale * MAX_ZOOM])
        .on('zoom', (event) => {
          layer.setAttribute('transform', event.transform.toString());
          readout.textContent = `${Math.round(100 * event.transform.k / geometry.scale)}%`;
          if (event.sourceEvent) mode = 'moved';
          minimap.update(event.transform, stage.clientWidth, stage.clientHeight);
        });
    current = {svg, layer, zoom, geometry};
    // A double click stays free for the nodes (opening a group, later).
    d3.select(svg).call(zoom).on('dblclick.zoom', null);
    if (mode === 'moved' && before) apply(before);
    else place(mode);
    search.refresh();
  }

  return {
    show,
    fit: () => {
      mode = 'fit';
      place('fit');
    },
    natural: () => current && moveTo(transformFor('natural')),
    destroy: () => {
      resized.disconnect();
      minimap.clear();
    },
  };
}

// The Explorer's anywidget view: `svg` from Python, `clicked` back to it.
function renderWidget({model, el}) {
  const viewer = mountViewer(el, {
    onClick: (id) => {
      model.set('clicked', id);
      model.set('click_count', model.get('click_count') + 1);
      model.save_changes();
    },
  });
  const update = () => viewer.show(model.get('svg'));
  update();
  model.on('change:svg', update);
  return () => {
    model.off('change:svg', update);
    viewer.destroy();
  };
}

// The static report: every diagram rendered inline in the page.
function mountStatic(root) {
  for (const host of root.querySelectorAll('.remat-viewer-static')) {
    const svg = host.querySelector('svg');
    if (!svg) continue;
    // Kept on its element: a page's own script can show another drawing.
    host.rematViewer = mountViewer(host);
    host.rematViewer.show(svg);
  }
}
