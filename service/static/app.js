// The page: try a model and inspect its versions. Plain JavaScript, no build step, no
// library, nothing fetched from another origin (the service's Content-Security-Policy allows
// none). What it offers follows from the model's signature, as the service describes it
// (GET /page/models/{name}): an upload and a drawing pad for image models, a form of the
// model's features, or a JSON box for anything else. It re-implements no preprocessing: the
// service prepares every image (artifact.images) and answers, with include_pixels=true, the
// image the model received; a model that decodes its own images (`image_bytes`) gets each
// file, and the drawing as a PNG, as it is.

const $ = (id) => document.getElementById(id);

const state = {
  modelName: null, // the model the page shows (GET /page/models, the selector)
  form: null, // what /predict takes for it and answers (GET /page/models/{name}), when known
  device: null, // where it runs (GET /readyz)
  servingVersion: null, // the version answering requests that name none (GET /readyz)
  predictSeq: 0, // the newest /predict request: older answers arriving late are dropped
  reportSeq: 0, // likewise for the report shown
  previews: [], // blob: URLs of the images shown, released when replaced
  padDirty: false,
};

// --- talking to the service ------------------------------------------------------------

class ApiError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.status = status;
  }
}

// What a failed call means, in words, from the service's {"error": "..."} body.
function explain(status, message) {
  if (status === 503) {
    // /readyz says "not ready: <why>", a prediction "model <name> is not ready: <why>".
    const reason = message.replace(/^(?:not ready: |model \S+ is not ready: )/, '');
    if (reason !== message) return `The service is not ready: ${reason}`;
    return `The service cannot answer now: ${message}`;
  }
  if (status === 413) return `Too much at once: ${message}`;
  if (status === 400) return `The service could not use this input: ${message}`;
  if (status === 404) return `Not found: ${message}`;
  if (status === 429) return `The service is busy, try again in a moment: ${message}`;
  return `The service answered ${status}: ${message}`;
}

async function api(path, options = {}) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: 'application/json' }, ...options });
  } catch (err) {
    throw new ApiError(`Could not reach the service (${err.message}). Is it running?`);
  }
  if (response.ok) return response.json();
  let message = response.statusText || 'no details';
  try {
    const body = await response.json();
    if (body && typeof body.error === 'string') message = body.error;
  } catch {
    // Not JSON (a proxy's error page, say): the status line says enough.
  }
  throw new ApiError(explain(response.status, message), response.status);
}

function showError(element, err) {
  const message = err instanceof ApiError ? err.message : `Something went wrong on this page: ${err}`;
  element.textContent = message;
  element.hidden = false;
}

function clearError(element) {
  element.textContent = '';
  element.hidden = true;
}

function el(tag, options = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(options)) {
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

// '2026-01-02T03:04:05+00:00' as '2026-01-02 03:04 UTC' (the report's own words otherwise).
const shortDate = (iso) =>
  typeof iso === 'string' ? iso.replace(/^(\d{4}-\d\d-\d\d)T(\d\d:\d\d):\d\d(\.\d+)?\+00:00$/, '$1 $2 UTC') : '–';
const percent = (value, digits = 1) => `${(value * 100).toFixed(digits)}%`;
const integer = (value) => (typeof value === 'number' ? value.toLocaleString('en') : '–');
const modelPath = () => `/page/models/${encodeURIComponent(state.modelName)}`;
const predictPath = () => `/predict/${encodeURIComponent(state.modelName)}`;
const plural = (count, word) => `${count} ${word}${count === 1 ? '' : 's'}`;
// A value of the answer as text: numbers as they came, a list of numbers (a regressor's
// several values) separated by commas, anything else as JSON.
const shown = (value) => {
  if (typeof value === 'number') return String(value);
  if (Array.isArray(value) && value.every((item) => typeof item === 'number')) return value.join(', ');
  return JSON.stringify(value);
};
// Whether the model takes images: prepared by the service, or decoded by the model itself. Until
// the service can say (no version serves yet), the image inputs show.
const takesImages = () => !state.form || state.form.kind === 'image' || state.form.kind === 'image_bytes';

// --- readiness ---------------------------------------------------------------------------

async function refreshReadiness() {
  const line = $('service-status');
  try {
    const ready = await api('/readyz');
    state.device = ready.device;
    state.servingVersion = ready.version;
    line.textContent = `Ready: ${ready.model} version ${ready.version} answers, on ${ready.device}.`;
    line.className = 'service-status ready';
  } catch (err) {
    state.servingVersion = null;
    line.textContent = err.message;
    line.className = 'service-status not-ready';
  }
}

// --- the model's form ---------------------------------------------------------------------

// What /predict takes for the model decides which inputs show. Until the service can say (no
// version serves yet), the image inputs show: /predict then answers why it cannot predict.
async function loadForm(render = true) {
  const line = $('model-status');
  state.form = null;
  let description = null;
  try {
    description = await api(modelPath());
  } catch (err) {
    line.textContent = err.message;
  }
  if (description) {
    state.form = description.form;
    state.servingVersion = description.ready ? description.model_version : null;
    if (description.ready) {
      // The model shown, where /readyz speaks of the default one.
      const status = $('service-status');
      const where = state.device ? `, on ${state.device}` : '';
      status.textContent = `Ready: ${state.modelName} version ${description.model_version} answers${where}.`;
      status.className = 'service-status ready';
    }
    if (description.problem) line.textContent = `The page cannot try ${state.modelName}: ${description.problem}`;
    else if (!description.ready) line.textContent = `${state.modelName} is not ready: ${description.reason}`;
    else line.textContent = describeForm(description);
  }
  if (render) showInputs();
}

function describeForm(description) {
  const form = description.form;
  let task = { classification: 'a classifier', regression: 'a regressor', outputs: 'a model' }[form.task];
  // One float output of several values per instance: probabilities only while its rows are.
  if (form.probabilities_guessed) task = 'a classifier or a regressor';
  let takes = 'tensors in TF Serving\'s JSON format';
  if (form.kind === 'image') {
    const { height, width, channels } = form.image;
    takes = `${width}×${height} ${channels === 3 ? 'colour' : 'grayscale'} images`;
  } else if (form.kind === 'image_bytes') {
    takes = `image files it decodes itself from its input ${form.inputs[0].name}`;
  } else if (form.kind === 'features') {
    takes = plural(form.features.length, 'feature');
  } else if (form.kind === 'examples') {
    takes = 'tf.Example features';
  }
  return `${state.modelName} version ${description.model_version} is ${task} of ${takes} (signature ${form.signature_name}).`;
}

function showInputs() {
  const kind = state.form ? state.form.kind : 'image';
  $('image-inputs').hidden = !takesImages();
  $('features-form').hidden = kind !== 'features';
  $('json-form').hidden = kind !== 'examples' && kind !== 'tensors';
  if (kind === 'image') setUpImageInputs(state.form ? state.form.image : null);
  if (kind === 'image_bytes') setUpImageInputs(null, state.form.inputs[0].name);
  if (kind === 'features') buildFeatureFields(state.form.features);
  if (kind === 'examples' || kind === 'tensors') fillJsonTemplate(state.form);
}

// The image contract's preparation (light on dark, centred) may invert; a model trained on an
// image folder gets its images as they are, resized to its input; a model that decodes its own
// images (`encodedInput`, its `image_bytes`) gets each file as it is.
function setUpImageInputs(image, encodedInput = null) {
  const centred = !encodedInput && (!image || image.preparation === 'centred');
  $('invert').value = 'auto';
  $('invert-choice').hidden = !centred;
  if (encodedInput) {
    $('image-hint').textContent = `The model decodes its images itself (its input ${encodedInput}): the service sends it each file as it is, and the drawing as a PNG.`;
  } else {
    $('image-hint').textContent = centred
      ? 'The model was trained on light objects on a dark background, trimmed and centred; the service prepares every image that way and shows what the model received.'
      : `The model was trained on images resized to ${image.width}×${image.height} ${image.channels === 3 ? 'in colour' : 'in grayscale'}; the service resizes every image the same way and shows what the model received.`;
  }
  const pad = $('pad');
  const [width, height] = image ? [image.width, image.height] : [1, 1];
  const scale = 280 / Math.max(width, height);
  pad.width = Math.round(width * scale);
  pad.height = Math.round(height * scale);
  pad.style.setProperty('--aspect', `${pad.width} / ${pad.height}`);
  clearPad();
}

// One field per feature: a number field for numbers and integers, a text field for strings,
// a checkbox for booleans; a feature of several values takes them as a JSON list.
function buildFeatureFields(features) {
  const fields = features.map((feature) => {
    const id = `feature-${feature.name}`;
    const scalar = feature.shape.length === 0 || (feature.shape.length === 1 && feature.shape[0] === 1);
    let input;
    let words = feature.type;
    if (!scalar) {
      input = el('input', { type: 'text', id, 'data-feature': feature.name, 'data-json': 'true', required: '' });
      words = `${feature.shape.join('×')} ${feature.type}s, as a JSON list`;
    } else if (feature.type === 'boolean') {
      input = el('input', { type: 'checkbox', id, 'data-feature': feature.name });
    } else if (feature.type === 'string') {
      input = el('input', { type: 'text', id, 'data-feature': feature.name, autocomplete: 'off' });
    } else {
      input = el('input', {
        type: 'number',
        id,
        'data-feature': feature.name,
        step: feature.type === 'integer' ? '1' : 'any',
        inputmode: feature.type === 'integer' ? 'numeric' : 'decimal',
        required: '',
      });
    }
    input.dataset.type = feature.type;
    return el(
      'div',
      { class: 'field' },
      el('label', { for: id }, feature.name, el('span', { class: 'field-type', text: ` (${words})` })),
      input,
    );
  });
  $('feature-fields').replaceChildren(...fields);
}

function featureValues() {
  const instance = {};
  for (const input of $('feature-fields').querySelectorAll('input[data-feature]')) {
    const name = input.dataset.feature;
    if (input.dataset.json) {
      try {
        instance[name] = JSON.parse(input.value);
      } catch {
        throw new ApiError(`${name}: not a JSON list: ${input.value}`);
      }
    } else if (input.dataset.type === 'boolean') {
      instance[name] = input.checked;
    } else if (input.dataset.type === 'string') {
      instance[name] = input.value;
    } else {
      if (input.value.trim() === '' || !Number.isFinite(Number(input.value))) {
        throw new ApiError(`${name}: enter a number.`);
      }
      instance[name] = Number(input.value);
    }
  }
  return instance;
}

function fillJsonTemplate(form) {
  $('json-model').textContent = state.modelName;
  const examples = form.kind === 'examples';
  $('json-hint').textContent = examples
    ? 'The model parses tf.Examples: send one object of features per instance. Integers become int64 features, other numbers float ones: write 1.0 for a float feature.'
    : 'The model takes tensors its signature names: send them in TF Serving\'s row ("instances") or columnar ("inputs") format.';
  const template = examples
    ? { instances: [{ feature: 1.0 }] }
    : { instances: [Object.fromEntries(form.inputs.map((input) => [input.name, null]))] };
  const body = $('json-body');
  if (!body.value) body.value = JSON.stringify(template, null, 2).replace(/": 1$/m, '": 1.0');
}

// --- try it ------------------------------------------------------------------------------

// POST /predict/{model} and show each answer as a card; `cards(answer)` builds them.
async function predict(body, what, cards) {
  const error = $('try-error');
  clearError(error);
  const seq = ++state.predictSeq;
  const status = $('try-status');
  status.textContent = `Asking ${state.modelName} about ${what}…`;
  const started = performance.now();
  try {
    const answer = await api(body.query ? `${predictPath()}?${body.query}` : predictPath(), {
      method: 'POST',
      body: body.content,
      headers: body.json ? { Accept: 'application/json', 'Content-Type': 'application/json' } : { Accept: 'application/json' },
    });
    if (seq !== state.predictSeq) return;
    const ms = Math.round(performance.now() - started);
    releasePreviews();
    $('results').replaceChildren(...cards(answer));
    const where = state.device ? ` on ${state.device}` : '';
    const rows = Array.isArray(answer.predictions) ? answer.predictions.length : 1;
    const noun = takesImages() ? 'image' : 'instance';
    status.textContent =
      `${answer.model_name} version ${answer.model_version}${where} answered ${plural(rows, noun)} in ${ms} ms.`;
  } catch (err) {
    if (seq !== state.predictSeq) return;
    renderResults([], null);
    status.textContent = '';
    showError(error, err);
  }
}

function classify(files) {
  if (files.length === 0) return;
  const form = new FormData();
  files.forEach((file, i) => form.append('files', file, file.name || `pasted-${i + 1}.png`));
  const invert = encodeURIComponent($('invert').value);
  // A model that decodes its own images: the service never sees their pixels to show.
  const encoded = state.form && state.form.kind === 'image_bytes';
  return predict(
    { content: form, query: encoded ? '' : `include_pixels=true&invert=${invert}` },
    plural(files.length, 'image'),
    (answer) => answer.predictions.map((row, i) => resultCard(files[i], row, answer)),
  );
}

function releasePreviews() {
  state.previews.forEach((url) => URL.revokeObjectURL(url));
  state.previews = [];
}

function renderResults(files, answer) {
  releasePreviews();
  const results = $('results');
  results.replaceChildren();
  if (!answer) return;
  answer.predictions.forEach((row, i) => results.append(resultCard(files[i], row, answer)));
}

// The image the model received: rows of gray levels, or of [r, g, b].
function modelInputCanvas(pixels) {
  const height = pixels.length;
  const width = pixels[0].length;
  const colour = Array.isArray(pixels[0][0]) && pixels[0][0].length === 3;
  const canvas = el('canvas', {
    class: 'model-input',
    width: String(width),
    height: String(height),
    role: 'img',
    'aria-label': `The ${width} by ${height} ${colour ? 'colour' : 'grayscale'} image the model received`,
  });
  const context = canvas.getContext('2d');
  const image = context.createImageData(width, height);
  pixels.flat().forEach((value, i) => {
    const [r, g, b] = Array.isArray(value) ? (value.length === 3 ? value : [value[0], value[0], value[0]]) : [value, value, value];
    image.data.set([r, g, b, 255], i * 4);
  });
  context.putImageData(image, 0, 0);
  return canvas;
}

function resultCard(file, row, answer) {
  const name = row.file || (file && file.name) || 'image';
  const preview = URL.createObjectURL(file);
  state.previews.push(preview);
  const original = el(
    'figure',
    {},
    el('img', { src: preview, alt: `The image you gave: ${name}`, class: 'original' }),
    el('figcaption', { text: 'Your image' }),
  );
  const pair = el('div', { class: 'pair' }, original);
  if (row.pixels) {
    pair.append(
      el(
        'figure',
        {},
        modelInputCanvas(row.pixels),
        el('figcaption', { text: `What the model received (${row.pixels[0].length}×${row.pixels.length})` }),
      ),
    );
  }
  return answerCard(name, row, answer, pair);
}

// One instance's answer: a classifier's label and probability bars, a regressor's value, or
// the outputs as the service rendered them.
function answerCard(name, row, answer, ...before) {
  const parts = [];
  if (row && typeof row === 'object' && row.probabilities && typeof row.label === 'string') {
    const top = row.probabilities[row.label];
    const bars = el('ul', { class: 'bars', 'aria-label': `Probability of every class for ${name}` });
    for (const [label, probability] of Object.entries(row.probabilities)) {
      const fill = el('span', { class: 'bar-fill' });
      fill.style.setProperty('--p', String(probability));
      bars.append(
        el(
          'li',
          { class: label === row.label ? 'bar-row top' : 'bar-row' },
          el('span', { class: 'bar-label', text: label }),
          el('span', { class: 'bar', 'aria-hidden': 'true' }, fill),
          el('span', { class: 'bar-value', text: percent(probability) }),
        ),
      );
    }
    parts.push(
      el(
        'p',
        { class: 'prediction' },
        'Predicted: ',
        el('strong', { class: 'predicted-label', text: row.label }),
        ` (${percent(top)})`,
      ),
      bars,
    );
  } else if (row && typeof row === 'object' && 'value' in row) {
    parts.push(
      el(
        'p',
        { class: 'prediction' },
        Array.isArray(row.value) ? 'Predicted values: ' : 'Predicted value: ',
        el('strong', { class: 'predicted-value', text: shown(row.value) }),
      ),
    );
  } else {
    parts.push(el('pre', { class: 'outputs', text: JSON.stringify(row, null, 2) }));
  }
  return el(
    'article',
    { class: 'card', 'data-label': row && row.label !== undefined ? row.label : '' },
    el('h3', { class: 'card-title', text: name }),
    ...before,
    ...parts,
    el('p', {
      class: 'answered-by',
      text: `Answered by ${answer.model_name} version ${answer.model_version}` +
        (state.device ? ` on ${state.device}` : ''),
    }),
  );
}

function setUpFeatures() {
  $('features-form').addEventListener('submit', (event) => {
    event.preventDefault();
    let instance;
    try {
      instance = featureValues();
    } catch (err) {
      showError($('try-error'), err);
      return;
    }
    predict(
      { content: JSON.stringify({ instances: [instance] }), json: true },
      'these features',
      (answer) => answer.predictions.map((row) => answerCard('Your features', row, answer)),
    );
  });
  $('json-form').addEventListener('submit', (event) => {
    event.preventDefault();
    // Sent as typed: JSON.parse would turn 1.0 into 1, another type in a tf.Example.
    predict({ content: $('json-body').value, json: true }, 'this body', (answer) =>
      (Array.isArray(answer.predictions) ? answer.predictions : [answer.predictions]).map((row, i) =>
        answerCard(`instances[${i}]`, row, answer),
      ),
    );
  });
}

function setUpFiles() {
  const input = $('file-input');
  input.addEventListener('change', () => {
    classify([...input.files]);
    input.value = ''; // choosing the same file again classifies it again
  });
  const zone = $('dropzone');
  for (const type of ['dragenter', 'dragover']) {
    zone.addEventListener(type, (event) => {
      event.preventDefault();
      zone.classList.add('dragging');
    });
  }
  zone.addEventListener('dragleave', () => zone.classList.remove('dragging'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('dragging');
    const files = [...event.dataTransfer.files];
    if (files.length === 0) {
      showError($('try-error'), new ApiError('Nothing to classify: drop image files, not text or links.'));
      return;
    }
    classify(files);
  });
  // A file dropped beside the zone must not make the browser leave the page to show it.
  for (const type of ['dragover', 'drop']) {
    window.addEventListener(type, (event) => event.preventDefault());
  }
  document.addEventListener('paste', (event) => {
    const files = [...(event.clipboardData ? event.clipboardData.files : [])];
    if (files.length > 0 && !$('image-inputs').hidden) {
      event.preventDefault();
      classify(files);
    } else if (files.length === 0 && !event.target.closest('input, select, textarea') && !$('image-inputs').hidden) {
      showError(
        $('try-error'),
        new ApiError('The clipboard holds no image: copy an image itself (not its address) and paste again.'),
      );
    }
  });
}

function clearPad() {
  const pad = $('pad');
  const context = pad.getContext('2d');
  context.fillStyle = '#fff';
  context.fillRect(0, 0, pad.width, pad.height);
  // Resizing a canvas resets its context: the pen is set again each time.
  context.lineWidth = Math.max(pad.width, pad.height) / 16;
  context.lineCap = 'round';
  context.lineJoin = 'round';
  context.strokeStyle = '#000';
  state.padDirty = false;
}

function setUpDrawing() {
  const pad = $('pad');
  const context = pad.getContext('2d');
  clearPad();
  let drawing = false;
  const point = (event) => {
    const box = pad.getBoundingClientRect();
    return [
      ((event.clientX - box.left) * pad.width) / box.width,
      ((event.clientY - box.top) * pad.height) / box.height,
    ];
  };
  pad.addEventListener('pointerdown', (event) => {
    drawing = true;
    pad.setPointerCapture(event.pointerId);
    const [x, y] = point(event);
    context.beginPath();
    context.moveTo(x, y);
    context.lineTo(x, y);
    context.stroke();
    state.padDirty = true;
  });
  pad.addEventListener('pointermove', (event) => {
    if (!drawing) return;
    const [x, y] = point(event);
    context.lineTo(x, y);
    context.stroke();
  });
  const finish = () => {
    if (!drawing) return;
    drawing = false;
    classifyDrawing();
  };
  pad.addEventListener('pointerup', finish);
  pad.addEventListener('pointercancel', finish);
  $('classify-drawing').addEventListener('click', classifyDrawing);
  $('clear-drawing').addEventListener('click', () => {
    clearPad();
    renderResults([], null);
    $('try-status').textContent = '';
    clearError($('try-error'));
  });
}

function classifyDrawing() {
  if (!state.padDirty) {
    showError($('try-error'), new ApiError('The drawing pad is empty: draw something first.'));
    return;
  }
  $('pad').toBlob((blob) => {
    if (blob) classify([new File([blob], 'drawing.png', { type: 'image/png' })]);
    else showError($('try-error'), new ApiError('The browser could not turn the drawing into an image.'));
  }, 'image/png');
}

// --- inspect -----------------------------------------------------------------------------

// The versions table, one column per entry: an optional column (labels: stable, canary, ...)
// shows only when some row has a value for it.
const VERSION_COLUMNS = [
  { title: 'Version', header: true, cell: (v) => v.version },
  { title: 'State', cell: (v) => v.state },
  { title: 'Labels', optional: true, cell: (v) => (v.labels.length ? v.labels.join(', ') : '') },
  { title: 'Test accuracy', numeric: true, optional: true, cell: (v) => (typeof v.accuracy === 'number' ? percent(v.accuracy, 2) : '') },
  { title: 'Test RMSE', numeric: true, optional: true, cell: (v) => (typeof v.rmse === 'number' ? v.rmse.toPrecision(4) : '') },
  { title: 'Test MAE', numeric: true, optional: true, cell: (v) => (typeof v.mae === 'number' ? v.mae.toPrecision(4) : '') },
  { title: () => (takesImages() ? 'Test images' : 'Test examples'), numeric: true, cell: (v) => integer(v.examples) },
  { title: 'Steps', numeric: true, cell: (v) => integer(v.global_step) },
  { title: 'Kind', cell: (v) => v.model || '–' },
  { title: 'Exported', cell: (v) => shortDate(v.date) },
  { title: 'Report', cell: reportButton },
];

function reportButton(v) {
  if (!v.evaluation) return v.error || 'none';
  const button = el('button', { type: 'button', class: 'show-report', 'data-version': v.version, text: `Show report` });
  button.setAttribute('aria-label', `Show the report of version ${v.version}`);
  button.addEventListener('click', () => showReport(v.version));
  return button;
}

// Each version's state as the model status says it (the labels come with the listing).
function stateOf(status, version) {
  if (!status) return 'unknown';
  const entry = status.model_version_status.find((s) => s.version === version);
  if (!entry) return 'not loaded';
  let text = entry.state;
  if (version === state.servingVersion) text += ' (serving)';
  const problem = entry.status && entry.status.error_message;
  if (problem) text += `: ${problem}`;
  return text;
}

async function loadVersions() {
  const error = $('inspect-error');
  clearError(error);
  $('versions-status').textContent = 'Reading the versions…';
  let listing;
  try {
    listing = await api(`${modelPath()}/versions`);
  } catch (err) {
    $('versions-status').textContent = '';
    showError(error, err);
    return;
  }
  let status = null;
  if (listing.versions.length > 0) {
    try {
      status = await api(`/v1/models/${encodeURIComponent(state.modelName)}`);
    } catch (err) {
      showError(error, new ApiError(`The versions' states are unknown. ${err.message}`));
    }
  }
  const rows = listing.versions.map((v) => ({
    ...v,
    labels: Array.isArray(v.labels) ? v.labels : [],
    state: stateOf(status, v.version),
  }));
  renderVersions(rows);
  $('versions-status').textContent = rows.length
    ? `${rows.length} version${rows.length === 1 ? '' : 's'} on disk.`
    : 'No version has been exported yet (make train exports one).';
}

function renderVersions(rows) {
  const columns = VERSION_COLUMNS.filter(
    (column) => !column.optional || rows.some((row) => column.cell(row) !== ''),
  );
  const table = $('versions');
  const title = (column) => (typeof column.title === 'function' ? column.title() : column.title);
  table.tHead.rows[0].replaceChildren(...columns.map((column) => el('th', { scope: 'col', text: title(column) })));
  const body = table.tBodies[0];
  body.replaceChildren(
    ...rows.map((row) =>
      el(
        'tr',
        { 'data-version': row.version },
        ...columns.map((column) => {
          const content = column.cell(row);
          const cell = el(column.header ? 'th' : 'td', column.header ? { scope: 'row' } : {});
          if (column.numeric) cell.className = 'number';
          cell.append(content);
          return cell;
        }),
      ),
    ),
  );
}

async function showReport(version) {
  const seq = ++state.reportSeq;
  const error = $('inspect-error');
  clearError(error);
  let report;
  try {
    report = await api(`${modelPath()}/versions/${encodeURIComponent(version)}/report`);
  } catch (err) {
    if (seq === state.reportSeq) showError(error, err);
    return;
  }
  if (seq !== state.reportSeq) return;
  renderReport(report);
  const article = $('report');
  article.hidden = false;
  $('report-title').focus();
}

// Alt texts of the plots an export draws (artifact.contract.EXPORT_PLOTS).
const PLOT_WORDS = {
  'predicted_vs_true.png': 'the predicted values against the true ones, one dot per test example',
  'residuals.png': 'the residuals (predicted minus true) against the predicted values',
};

function plotImage(url, words, failure) {
  const image = el('img', { src: url, alt: words });
  image.addEventListener('error', () => image.replaceWith(el('p', { class: 'error', text: failure })));
  return el('figure', { class: 'plot' }, image);
}

function renderReport(report) {
  const evaluation = report.evaluation;
  const plotUrl = (plot) =>
    `${modelPath()}/versions/${encodeURIComponent(report.version)}/plots/${encodeURIComponent(plot)}`;
  $('report-title').textContent = `Version ${report.version} of ${report.model_name}`;
  const params = evaluation.params || {};
  // training/evaluation.py: a regressor's report has rmse and mae, a classifier's accuracy.
  const regression = typeof evaluation.rmse === 'number';
  const split = evaluation.split || 'test';
  const headline = regression
    ? [
        ['Test RMSE', `${evaluation.rmse} on ${integer(evaluation.examples)} ${split} examples`],
        ['Test MAE', evaluation.mae],
        ['Largest error', evaluation.max_error],
        ['Label mean and spread', typeof evaluation.label_mean === 'number' ? `${evaluation.label_mean} ± ${evaluation.label_std}` : null],
      ]
    : [['Test accuracy', `${percent(evaluation.accuracy, 2)} on ${integer(evaluation.examples)} ${split} ${takesImages() ? 'images' : 'examples'}`]];
  const facts = [
    ...headline,
    ['Kind', params.model],
    ['Steps', integer(evaluation.global_step)],
    ['Training time', typeof evaluation.train_seconds === 'number' ? `${evaluation.train_seconds} s` : null],
    ['Exported', evaluation.date],
    ['Data', evaluation.data_dir],
  ];
  $('report-summary').replaceChildren(
    ...facts
      .filter(([, value]) => value !== undefined && value !== null)
      .flatMap(([term, value]) => [el('dt', { text: term }), el('dd', { text: String(value) })]),
  );
  const perClass = Array.isArray(evaluation.per_class) ? evaluation.per_class : null;
  $('per-class-support').textContent = takesImages() ? 'Test images' : 'Test examples';
  $('classification-report').hidden = !perClass;
  if (perClass) {
    $('per-class').tBodies[0].replaceChildren(
      ...perClass.map((row) =>
        el(
          'tr',
          {},
          el('th', { scope: 'row', text: row.label }),
          el('td', { class: 'number', text: percent(row.precision) }),
          el('td', { class: 'number', text: percent(row.recall) }),
          el('td', { class: 'number', text: integer(row.support) }),
        ),
      ),
    );
    renderConfusion(evaluation);
  }
  const hasConfusionPng = report.plots.includes('confusion_matrix.png');
  $('confusion-png-line').hidden = !hasConfusionPng;
  if (hasConfusionPng) $('confusion-png').href = plotUrl('confusion_matrix.png');
  const regressionPlots = Object.keys(PLOT_WORDS).filter((plot) => report.plots.includes(plot));
  $('regression-report').hidden = !regression && regressionPlots.length === 0;
  $('regression-plots').replaceChildren(
    ...regressionPlots.map((plot) =>
      plotImage(plotUrl(plot), `Version ${report.version}: ${PLOT_WORDS[plot]}`, `${plot} could not be loaded.`),
    ),
  );
  if (regression && regressionPlots.length === 0) {
    $('regression-plots').replaceChildren(el('p', { text: 'No plots of the predictions were exported with this version.' }));
  }
  renderSlices(regression ? evaluation.slices : null);
  const curves = $('learning-curves');
  if (report.plots.includes('learning_curves.png')) {
    const image = el('img', {
      src: plotUrl('learning_curves.png'),
      alt: `Learning curves of version ${report.version}: loss and ${regression ? 'RMSE' : 'accuracy'} against the training step, for the training batches and for the evaluations on the test split`,
    });
    image.addEventListener('error', () =>
      curves.replaceChildren(el('p', { class: 'error', text: 'The learning curves could not be loaded.' })),
    );
    curves.replaceChildren(image);
  } else {
    curves.replaceChildren(el('p', { text: 'No learning curves were exported with this version.' }));
  }
  renderBlessing(report.blessing);
}

// A regressor's errors over slices: each categorical column's worst values first.
function renderSlices(slices) {
  const rows = [];
  for (const [column, values] of Object.entries(slices || {})) {
    for (const value of (Array.isArray(values) ? values : []).slice(0, 3)) {
      rows.push(
        el(
          'tr',
          {},
          el('th', { scope: 'row', text: column }),
          el('td', { text: String(value.value) }),
          el('td', { class: 'number', text: String(value.rmse) }),
          el('td', { class: 'number', text: String(value.mae) }),
          el('td', { class: 'number', text: integer(value.examples) }),
        ),
      );
    }
  }
  $('slices').tBodies[0].replaceChildren(...rows);
  $('slices').hidden = rows.length === 0;
}

function renderConfusion(evaluation) {
  const labels = evaluation.per_class.map((row) => row.label);
  const matrix = evaluation.confusion_matrix;
  const table = $('confusion');
  const head = el(
    'thead',
    {},
    el(
      'tr',
      {},
      el('td', { class: 'corner', text: 'true ↓ predicted →' }),
      ...labels.map((label) => el('th', { scope: 'col', text: label })),
    ),
  );
  const body = el(
    'tbody',
    {},
    ...matrix.map((counts, row) => {
      const total = counts.reduce((sum, count) => sum + count, 0) || 1;
      return el(
        'tr',
        {},
        el('th', { scope: 'row', text: labels[row] }),
        ...counts.map((count, column) => {
          const share = count / total;
          const cell = el('td', {
            class: share > 0.5 ? 'cell dark' : 'cell',
            title: `true ${labels[row]}, predicted ${labels[column]}: ${count} (${percent(share)} of ${labels[row]})`,
            text: String(count),
          });
          if (row === column) cell.classList.add('diagonal');
          cell.style.setProperty('--share', share.toFixed(4));
          return cell;
        }),
      );
    }),
  );
  table.replaceChildren(
    el('caption', { class: 'visually-hidden', text: 'Confusion matrix: rows are true classes, columns predicted classes' }),
    head,
    body,
  );
}

// Retraining's blessing.json, shown when a version has one: the verdict, the metrics of the
// candidate and the baseline side by side where they are numbers, and the whole report.
function renderBlessing(blessing) {
  const section = $('blessing');
  section.hidden = !blessing;
  if (!blessing) return;
  const parts = [];
  if (typeof blessing.blessed === 'boolean') {
    parts.push(
      el('p', {
        class: blessing.blessed ? 'verdict blessed' : 'verdict not-blessed',
        text: blessing.blessed ? 'Blessed: the candidate passed every threshold.' : 'Not blessed: the candidate failed a threshold.',
      }),
    );
  }
  const candidate = blessing.candidate || {};
  const baseline = blessing.baseline || {};
  const metrics = Object.keys({ ...candidate, ...baseline }).filter(
    (key) => typeof candidate[key] === 'number' || typeof baseline[key] === 'number',
  );
  if (metrics.length) {
    const show = (value) => (typeof value === 'number' ? value.toFixed(4) : '–');
    parts.push(
      el(
        'div',
        { class: 'table-scroll' },
        el(
          'table',
          { class: 'numbers', id: 'blessing-metrics' },
          el('caption', { text: 'Metrics on the same held-out data' }),
          el(
            'thead',
            {},
            el('tr', {}, ...['Metric', 'Candidate', 'Baseline', 'Change'].map((text) => el('th', { scope: 'col', text }))),
          ),
          el(
            'tbody',
            {},
            ...metrics.map((key) => {
              const change =
                typeof candidate[key] === 'number' && typeof baseline[key] === 'number'
                  ? (candidate[key] - baseline[key]).toFixed(4)
                  : '–';
              return el(
                'tr',
                {},
                el('th', { scope: 'row', text: key }),
                el('td', { class: 'number', text: show(candidate[key]) }),
                el('td', { class: 'number', text: show(baseline[key]) }),
                el('td', { class: 'number', text: change }),
              );
            }),
          ),
        ),
      ),
    );
  }
  parts.push(
    el(
      'details',
      {},
      el('summary', { text: 'The whole blessing report' }),
      el('pre', { text: JSON.stringify(blessing, null, 2) }),
    ),
  );
  $('blessing-body').replaceChildren(...parts);
}

// --- start -------------------------------------------------------------------------------

async function selectModel(name) {
  state.modelName = name;
  $('model-name').textContent = name;
  $('model-select').value = name;
  document.title = `${name}: try and inspect the model`;
  renderResults([], null);
  $('try-status').textContent = '';
  clearError($('try-error'));
  $('report').hidden = true;
  await loadForm();
  await loadVersions();
}

async function start() {
  window.addEventListener('error', (event) => showError($('page-error'), event.message));
  window.addEventListener('unhandledrejection', (event) => showError($('page-error'), event.reason));
  setUpFiles();
  setUpDrawing();
  setUpFeatures();
  $('refresh-versions').addEventListener('click', async () => {
    await refreshReadiness();
    await loadForm(false);
    await loadVersions();
  });
  $('model-select').addEventListener('change', () => selectModel($('model-select').value));
  try {
    await refreshReadiness();
    const { models } = await api('/page/models');
    // The default model first; ?model=<name> opens another.
    const asked = new URLSearchParams(window.location.search).get('model');
    $('model-select').replaceChildren(...models.map((name) => el('option', { value: name, text: name })));
    $('model-choice').hidden = models.length < 2;
    await selectModel(models.includes(asked) ? asked : models[0]);
  } catch (err) {
    showError($('inspect-error'), err);
  } finally {
    // Tests wait for this: the first look at the service is over, whatever it found.
    document.body.dataset.ready = 'true';
  }
}

start();
