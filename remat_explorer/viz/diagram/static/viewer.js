// The split-diagram viewer: a Graphviz SVG shown at its natural size, panned
// and zoomed with d3-zoom (wheel, drag, the toolbar), in the Explorer widget
// and in the static report alike. viewer.py puts this file after the d3
// modules it loads (`d3` below) and adds the entry point of each use.

const SVG_NS = 'http://www.w3.org/2000/svg';
const MAX_ZOOM = 8;  // times the natural size
const MARGIN = 8;  // px around the diagram in the initial and fitted views

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

// Mounts a viewer in `host`; returns {show(svg), fit(), natural(), destroy()}.
// `show` takes SVG text or an <svg> element already in the page.
// `onClick(id)` gets the id of a clicked Graphviz node (<g class="node">);
// a drag that ends on a node is not a click (d3-zoom swallows it). `focus`:
// the title of the cluster the natural view starts at.
function mountViewer(host, {onClick, focus = 'cluster_forward'} = {}) {
  host.classList.add('remat-viewer');
  const bar = document.createElement('div');
  bar.className = 'remat-viewer-bar';
  const stage = document.createElement('div');
  stage.className = 'remat-viewer-stage';
  const readout = document.createElement('span');
  readout.className = 'remat-viewer-zoom';
  let current = null;  // {svg, layer, zoom, geometry, touched}

  // Where the natural view starts: the top left of the forward pass, the
  // start of the program, wherever the layout put it (in layer units).
  const focusPoint = () => {
    const title = Array.from(current.layer.querySelectorAll('g.cluster > title'))
        .find((t) => t.textContent === focus);
    if (!title) return {x: 0, y: 0};
    const cluster = title.parentNode;
    const box = cluster.getBBox();
    const m = current.layer.getCTM().inverse().multiply(cluster.getCTM());
    return {x: box.x * m.a + box.y * m.c + m.e, y: box.x * m.b + box.y * m.d + m.f};
  };

  const transformFor = (which) => {
    const g = current.geometry;
    const width = stage.clientWidth, height = stage.clientHeight;
    if (which === 'fit') {
      const k = Math.min((width - 2 * MARGIN) / g.width, (height - 2 * MARGIN) / g.height,
                         g.scale);
      return d3.zoomIdentity.translate((width - g.width * k) / 2,
                                       Math.max((height - g.height * k) / 2, MARGIN)).scale(k);
    }
    // Natural size: centred across when it fits the width; else from the
    // forward pass's left edge. From the top, or from just above the
    // forward pass where it starts lower down.
    const k = g.scale, p = focusPoint();
    const x = g.width * k <= width ? (width - g.width * k) / 2
                                   : MARGIN - Math.max(0, p.x * k - 3 * MARGIN);
    const y = MARGIN - Math.max(0, p.y * k - 5 * MARGIN);
    return d3.zoomIdentity.translate(x, y).scale(k);
  };
  const place = (which) => {
    if (!current || stage.clientWidth === 0) return;
    d3.select(current.svg).call(current.zoom.transform, transformFor(which));
  };

  bar.append(
      button('fit', 'Zoom out to show the whole diagram', () => place('fit')),
      button('100%', 'Natural size: labels as Graphviz set them', () => place('natural')),
      button('+', 'Zoom in', () => current && d3.select(current.svg).call(current.zoom.scaleBy, 1.25)),
      button('\u2212', 'Zoom out', () => current && d3.select(current.svg).call(current.zoom.scaleBy, 0.8)),
      readout);
  const help = document.createElement('span');
  help.className = 'remat-viewer-help';
  help.textContent = 'wheel: zoom \u00b7 drag: pan';
  bar.append(help);
  host.replaceChildren(bar, stage);

  // A viewer mounted in a hidden tab has no size yet: the view is placed
  // when it gets one, and again on resizes until the user moves it.
  const resized = new ResizeObserver(() => {
    if (current && !current.touched) place('natural');
  });
  resized.observe(stage);

  stage.addEventListener('click', (event) => {
    // A node, or an opened group's cluster (a click on it closes the group).
    const node = event.target.closest && event.target.closest('g.node, g.cluster');
    if (node && node.id && onClick) onClick(node.id);
  });

  function show(source) {
    stage.replaceChildren();
    current = null;
    let svg = source;
    if (typeof source === 'string') {
      if (!source.trim()) {
        stage.textContent = 'no diagram';
        return;
      }
      const doc = new DOMParser().parseFromString(source, 'image/svg+xml');
      svg = doc.documentElement;
      if (svg.nodeName !== 'svg') {
        stage.textContent = 'the diagram could not be read';
        return;
      }
      svg = document.importNode(svg, true);
    }
    const geometry = naturalGeometry(svg);
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

    const zoom = d3.zoom()
        .scaleExtent([geometry.scale / 50, geometry.scale * MAX_ZOOM])
        .on('zoom', (event) => {
          layer.setAttribute('transform', event.transform.toString());
          readout.textContent = `${Math.round(100 * event.transform.k / geometry.scale)}%`;
          if (event.sourceEvent && current) current.touched = true;
        });
    current = {svg, layer, zoom, geometry, touched: false};
    // A double click stays free for the nodes (opening a group, later).
    d3.select(svg).call(zoom).on('dblclick.zoom', null);
    place('natural');
  }

  return {
    show,
    fit: () => place('fit'),
    natural: () => place('natural'),
    destroy: () => resized.disconnect(),
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
    if (svg) mountViewer(host).show(svg);
  }
}
