// The viewer's minimap: the whole drawing small in a corner of the stage, a
// rectangle on it where the main view is; a click or a drag on it moves the
// main view there. It shows the SVG as an image (one bitmap, however large
// the drawing), and hides while the whole drawing is in view.

const MINIMAP_SIZE = 160;  // px: the longer side

// Mounts the minimap in `stage`; `onPan(x, y)` centres the main view on a
// point of the drawing (in its units). Returns {show, update, clear}.
function mountMinimap(stage, onPan) {
  const box = document.createElement('div');
  box.className = 'remat-viewer-minimap';
  box.hidden = true;
  const image = document.createElement('img');
  image.alt = 'overview of the diagram';
  image.draggable = false;
  const frame = document.createElement('div');
  frame.className = 'remat-viewer-minimap-view';
  box.append(image, frame);
  let geometry = null, scale = 1, url = null;

  const drawingPoint = (event) => {
    const r = image.getBoundingClientRect();
    return [(event.clientX - r.left) / scale, (event.clientY - r.top) / scale];
  };
  // Pointer events stay in the minimap: the main view's drag never sees them.
  box.addEventListener('pointerdown', (event) => {
    if (!geometry || event.button !== 0) return;
    event.preventDefault();
    event.stopPropagation();
    box.setPointerCapture(event.pointerId);
    onPan(...drawingPoint(event));
  });
  box.addEventListener('pointermove', (event) => {
    if (geometry && box.hasPointerCapture(event.pointerId)) onPan(...drawingPoint(event));
  });
  box.addEventListener('click', (event) => event.stopPropagation());

  function clear() {
    if (url) URL.revokeObjectURL(url);
    url = null;
    geometry = null;
    box.hidden = true;
    box.remove();
  }

  // `svgText`: the drawing as standalone SVG; `g`: its naturalGeometry.
  function show(svgText, g) {
    clear();
    geometry = g;
    scale = Math.min(MINIMAP_SIZE / g.width, MINIMAP_SIZE / g.height);
    box.style.width = `${g.width * scale}px`;
    box.style.height = `${g.height * scale}px`;
    url = URL.createObjectURL(new Blob([svgText], {type: 'image/svg+xml'}));
    image.src = url;
    stage.appendChild(box);
  }

  // The main view shows the drawing under zoom transform `t` in a stage of
  // `width` x `height` px.
  function update(t, width, height) {
    if (!geometry) return;
    const x = -t.x / t.k, y = -t.y / t.k, w = width / t.k, h = height / t.k;
    const whole = x <= 0.5 && y <= 0.5 && x + w >= geometry.width - 0.5
        && y + h >= geometry.height - 0.5;
    // A stage too small to spare the corner shows none either.
    box.hidden = whole || width < 3 * MINIMAP_SIZE || height < 1.5 * MINIMAP_SIZE;
    Object.assign(frame.style, {
      left: `${x * scale}px`, top: `${y * scale}px`,
      width: `${w * scale}px`, height: `${h * scale}px`,
    });
  }

  return {show, update, clear};
}
