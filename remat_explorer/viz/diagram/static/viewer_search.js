// The viewer's search box: finds the diagram's nodes whose text holds the
// query (a value or node name, a module path, a source line such as
// `model.py:42`: what the labels and the tooltips say), marks them, says
// "k of n" and goes to each in turn. Enter: the next, Shift+Enter: the one
// before, Escape: clear.

const XLINK_NS = 'http://www.w3.org/1999/xlink';

// What a node says, lower case: its label lines, its tooltip (Graphviz
// writes it as the xlink:title of the node's link) and its id (<title>).
function nodeText(node) {
  const parts = Array.from(node.querySelectorAll('text'), (t) => t.textContent);
  for (const link of node.querySelectorAll('a')) {
    parts.push(link.getAttributeNS(XLINK_NS, 'title') || link.getAttribute('title') || '');
  }
  const title = node.querySelector('title');
  if (title) parts.push(title.textContent);
  return parts.join('\n').toLowerCase();
}

// Whether `text` holds `query`, where a query that ends in a digit ends a
// number: `model.py:4` is not found in `model.py:42`, nor `f0_e1` in `f0_e12`.
function holds(text, query) {
  const endsInDigit = /\d$/.test(query);
  for (let at = text.indexOf(query); at >= 0; at = text.indexOf(query, at + 1)) {
    if (!endsInDigit || !/\d/.test(text.charAt(at + query.length))) return true;
  }
  return false;
}

// Mounts the search box in `bar`. `nodes()`: the nodes of the drawing shown
// now; `goTo(node)`: bring one into view; `stage`: marked while a search
// shows. Returns {refresh(): search the new drawing again, without moving}.
function mountSearch(bar, {nodes, goTo, stage}) {
  const input = document.createElement('input');
  input.type = 'search';
  input.className = 'remat-viewer-search';
  input.placeholder = 'find: name, module, file.py:42';
  input.setAttribute('aria-label', 'Find in the diagram');
  input.title = 'Find nodes by name, module path or source line. '
      + 'Enter: next, Shift+Enter: previous, Escape: clear';
  // JupyterLab's keyboard shortcuts leave the box's keys to it.
  input.dataset.lmSuppressShortcuts = 'true';
  const found = document.createElement('span');
  found.className = 'remat-viewer-found';
  found.setAttribute('role', 'status');
  bar.append(input, found);
  let matches = [], at = -1, index = null;  // index: [{node, text}] of the drawing

  const unmark = () => {
    for (const node of matches) node.classList.remove('remat-match', 'remat-match-current');
    stage.classList.remove('remat-searching');
    matches = [];
    at = -1;
  };

  const say = () => {
    found.textContent = !input.value.trim() ? ''
        : matches.length ? `${at + 1} of ${matches.length}` : 'no match';
  };

  const select = (i) => {
    if (!matches.length) return;
    if (at >= 0) matches[at].classList.remove('remat-match-current');
    at = (i + matches.length) % matches.length;
    matches[at].classList.add('remat-match-current');
    goTo(matches[at]);
    say();
  };

  // Mark what the box's query finds; go to the first unless `stay`.
  const run = (stay) => {
    unmark();
    const query = input.value.trim().toLowerCase();
    if (query) {
      if (!index) index = nodes().map((node) => ({node, text: nodeText(node)}));
      matches = index.filter((n) => holds(n.text, query)).map((n) => n.node);
      for (const node of matches) node.classList.add('remat-match');
      stage.classList.toggle('remat-searching', matches.length > 0);
      if (matches.length && !stay) {
        select(0);
      } else if (matches.length) {
        at = 0;
        matches[0].classList.add('remat-match-current');
      }
    }
    say();
  };

  input.addEventListener('input', () => run(false));
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter') {
      event.preventDefault();
      if (!matches.length) run(false);
      else select(at + (event.shiftKey ? -1 : 1));
    } else if (event.key === 'Escape') {
      event.preventDefault();
      input.value = '';
      run(true);
    } else {
      return;
    }
    event.stopPropagation();  // not a notebook's run-cell or command-mode key
  });

  return {
    refresh() {
      index = null;
      matches = [];  // the old drawing's nodes are gone
      run(true);
    },
  };
}
