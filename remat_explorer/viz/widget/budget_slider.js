// The Explorer's memory budget: a share between the lowest and the highest
// compiled peak the Explorer knows. A labelled native range input, so that
// a screen reader names it and the arrow keys move it; `value` goes to
// Python when the user lets go, once per drag.
function render({model, el}) {
  el.classList.add('remat-budget-slider');
  const id = `remat-budget-${Math.random().toString(36).slice(2)}`;
  const label = document.createElement('label');
  label.htmlFor = id;
  label.textContent = model.get('description');
  const input = document.createElement('input');
  Object.assign(input, {type: 'range', id, min: '0', max: '1', step: String(model.get('step'))});
  // Its keys are its own: JupyterLab's shortcuts (arrows move between
  // cells) are not run for them.
  input.setAttribute('data-lm-suppress-shortcuts', 'true');
  const readout = document.createElement('output');
  readout.htmlFor = id;
  const say = (value) => {
    readout.textContent = `${Math.round(100 * value)}%`;
    input.setAttribute('aria-valuetext', `${readout.textContent} of the way from the lowest `
                       + 'compiled peak to the highest');
  };
  const shown = () => {
    input.value = String(model.get('value'));
    say(model.get('value'));
  };
  input.addEventListener('input', () => say(Number(input.value)));
  input.addEventListener('change', () => {
    model.set('value', Number(input.value));
    model.save_changes();
  });
  model.on('change:value', shown);
  shown();
  el.replaceChildren(label, input, readout);
  return () => model.off('change:value', shown);
}

export default {render};
