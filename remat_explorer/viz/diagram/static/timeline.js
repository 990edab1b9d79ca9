// The memory timeline (timeline_html.py): hovering over a band of the chart
// lists the buffers live there under it, a click keeps them, a click on the
// kept band (or leaving the chart with none kept) goes back to the peak.
// The peak's table is in the page; the others are built from the JSON
// beside the chart, whose text goes in as text (never as HTML).

// `text` into `td` as text, with a <wbr> after each '_', '/', '.', ... of
// its names and paths, where a line may break (tables.breakable_html).
function breakable(td, text) {
  for (const part of String(text).split(/(?<=[_/.,:(\[=\u00b7])(?=\w)/)) {
    if (td.firstChild) td.appendChild(document.createElement('wbr'));
    td.appendChild(document.createTextNode(part));
  }
}

function liveTable(data, list) {
  const table = document.createElement('table');
  table.className = 'remat-peak-table';
  table.createCaption().textContent = list.caption;
  const head = table.createTHead().insertRow();
  for (const c of list.columns) {
    const th = document.createElement('th');
    th.textContent = data.headings[c];
    head.appendChild(th);
  }
  const body = table.createTBody();
  for (const id of list.rows) {
    const row = data.rows[id];  // [kind, ...cells]
    const tr = body.insertRow();
    tr.className = 'remat-live-' + row[0];
    for (const c of list.columns) {
      const td = tr.insertCell();
      if (data.wrapped.includes(c)) {
        td.className = 'remat-wrap';
        breakable(td, row[1 + c]);
      } else {
        td.textContent = row[1 + c];
      }
      const tooltip = data.tooltips[row[1 + c]];  // a source line's whole path
      if (tooltip) td.title = tooltip;
    }
  }
  if (list.rest) {
    const tr = body.insertRow();
    tr.className = 'remat-live-rest';
    const td = tr.insertCell();
    td.colSpan = list.columns.length;
    td.textContent = list.rest;
  }
  return table;
}

function mountTimeline(timeline) {
  if (timeline.dataset.mounted) return;
  timeline.dataset.mounted = '1';
  const svg = timeline.querySelector('svg');
  const head = timeline.querySelector('.remat-live-head');
  const cursor = timeline.querySelector('.remat-cursor');
  const peak = timeline.querySelector('.remat-at[data-at="peak"]');
  const other = timeline.querySelector('.remat-at[data-at="band"]');
  const data = JSON.parse(timeline.querySelector('.remat-live-data').textContent);
  let kept = null;

  function show(band) {
    const key = band ? band.dataset.at : 'peak';
    peak.hidden = key !== 'peak';
    other.hidden = key === 'peak';
    if (key !== 'peak' && other.dataset.list !== key) {
      other.replaceChildren(liveTable(data, data.lists[key]));
      other.dataset.list = key;
    }
    head.textContent = band ? band.dataset.head : head.dataset.peak;
    if (band) {
      const x = parseFloat(band.dataset.x) + parseFloat(band.dataset.w) / 2;
      cursor.setAttribute('x1', x);
      cursor.setAttribute('x2', x);
    }
    cursor.setAttribute('visibility', band ? 'visible' : 'hidden');
    timeline.dataset.showing = band ? band.dataset.band : 'peak';
  }

  svg.addEventListener('pointerover', (event) => {
    const band = event.target.closest('.remat-band');
    if (band) show(band);
  });
  svg.addEventListener('pointerleave', () => show(kept));
  svg.addEventListener('click', (event) => {
    const band = event.target.closest('.remat-band');
    if (!band) return;
    kept = kept === band ? null : band;
    show(kept || band);
  });
}

function mountTimelines(root) {
  for (const timeline of root.querySelectorAll('.remat-timeline')) mountTimeline(timeline);
}

// The Explorer's Costs view: HTML from Python (`value`), its timelines mounted.
function renderHtmlWidget({ model, el }) {
  const draw = () => {
    el.innerHTML = model.get('value');
    mountTimelines(el);
  };
  draw();
  model.on('change:value', draw);
  return () => model.off('change:value', draw);
}
