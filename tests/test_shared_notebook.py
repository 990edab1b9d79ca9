"""`python -m remat_explorer share`: a saved notebook's widget views without
saved state give way to the output's static data; views with state stay.
(The browser test opens such a notebook in JupyterLab.)"""

from __future__ import annotations

import json
import secrets

from remat_explorer.__main__ import main
from remat_explorer.viz.widget.shared_notebook import WIDGET_STATE, WIDGET_VIEW


def _view(model_id: str) -> dict:
  return {'version_major': 2, 'version_minor': 0, 'model_id': model_id}


def _display(data: dict) -> dict:
  return {'output_type': 'display_data', 'data': data, 'metadata': {}}


def _notebook(saved_id: str, unsaved_ids: tuple[str, str]) -> dict:
  explorer, slider = unsaved_ids
  return {
      'nbformat': 4, 'nbformat_minor': 5,
      'metadata': {'widgets': {WIDGET_STATE: {
          'version_major': 2, 'version_minor': 0,
          'state': {saved_id: {'model_name': 'HTMLModel', 'state': {}}}}}},
      'cells': [
          {'cell_type': 'markdown', 'id': 'a', 'metadata': {}, 'source': 'Café ≤ 1 MiB'},
          {'cell_type': 'code', 'id': 'b', 'metadata': {}, 'execution_count': 1,
           'source': 'rx.explore(loss_fn, params, batch)', 'outputs': [
               _display({WIDGET_VIEW: _view(explorer),
                         'text/html': '<div class="remat-snapshot">snapshot</div>',
                         'text/plain': 'Explorer(...)'}),
               {'output_type': 'stream', 'name': 'stdout', 'text': 'compiled\n'}]},
          {'cell_type': 'code', 'id': 'c', 'metadata': {}, 'execution_count': 2,
           'source': 'widgets', 'outputs': [
               _display({WIDGET_VIEW: _view(saved_id), 'text/plain': 'HTML(...)'}),
               _display({WIDGET_VIEW: _view(slider), 'text/plain': 'IntSlider(value=3)'}),
               {'output_type': 'execute_result', 'execution_count': 2, 'metadata': {},
                'data': {'text/plain': '3'}}]},
      ]}


def test_share_drops_only_the_views_whose_state_was_not_saved(tmp_path, capsys):
  saved, explorer, slider = (secrets.token_hex(16) for _ in range(3))
  original = _notebook(saved, (explorer, slider))
  path = tmp_path / 'saved.ipynb'
  path.write_text(json.dumps(original, indent=1, ensure_ascii=False), encoding='utf-8')
  out = tmp_path / 'copy.ipynb'
  assert main(['share', str(path), '--out', str(out)]) == 0
  said = capsys.readouterr().out
  assert '2 widget view(s) without saved state dropped' in said, said
  assert '(1 of them text only)' in said and '1 kept' in said, said
  assert json.loads(path.read_text(encoding='utf-8')) == original  # --out leaves it be
  shared = json.loads(out.read_text(encoding='utf-8'))
  outputs = [o for cell in shared['cells'] for o in cell.get('outputs', ())]
  explorer_output, stream, kept, bare, result = outputs
  # The Explorer's snapshot and text stay, its view goes.
  assert explorer_output['data'] == {k: v for k, v in original['cells'][1]['outputs'][0]
                                     ['data'].items() if k != WIDGET_VIEW}
  assert kept['data'][WIDGET_VIEW]['model_id'] == saved
  assert bare['data'] == {'text/plain': 'IntSlider(value=3)'}
  assert (stream, result) == (original['cells'][1]['outputs'][1],
                              original['cells'][2]['outputs'][2])
  assert shared['metadata'] == original['metadata']
  assert shared['cells'][0]['source'] == 'Café ≤ 1 MiB'  # written as UTF-8
  # In place, and again: nothing more to drop.
  assert main(['share', str(out)]) == 0
  assert '0 widget view(s) without saved state dropped' in capsys.readouterr().out
  assert json.loads(out.read_text(encoding='utf-8')) == shared


def test_share_refuses_what_is_not_a_notebook(tmp_path, capsys):
  text = tmp_path / 'notes.ipynb'
  text.write_text('not json', encoding='utf-8')
  assert main(['share', str(text)]) == 2
  assert 'is not a notebook' in capsys.readouterr().err
  assert text.read_text(encoding='utf-8') == 'not json'
  old = tmp_path / 'old.ipynb'
  old.write_text(json.dumps({'nbformat': 3, 'worksheets': []}), encoding='utf-8')
  assert main(['share', str(old)]) == 2
  assert 'nbformat 4' in capsys.readouterr().err
  assert main(['share', str(tmp_path / 'missing.ipynb')]) == 2
  assert 'is not a file' in capsys.readouterr().err
  assert main(['share', str(old), '--out', str(tmp_path)]) == 2
  assert 'is a directory' in capsys.readouterr().err
