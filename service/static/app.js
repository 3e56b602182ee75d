// The page: try the model and inspect its versions. Plain JavaScript, no build step, no
// library, nothing fetched from another origin (the service's Content-Security-Policy allows
// none). It re-implements no preprocessing: the service prepares every image (artifact.images)
// and answers, with include_pixels=true, the 28x28 image the model received.

const $ = (id) => document.getElementById(id);

const state = {
  modelName: null, // the model the page shows (GET /page/models)
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

// --- try it ------------------------------------------------------------------------------

async function classify(files) {
  const error = $('try-error');
  clearError(error);
  if (files.length === 0) return;
  const seq = ++state.predictSeq;
  const status = $('try-status');
  status.textContent = `Classifying ${files.length} image${files.length === 1 ? '' : 's'}…`;
  const form = new FormData();
  files.forEach((file, i) => form.append('files', file, file.name || `pasted-${i + 1}.png`));
  const invert = encodeURIComponent($('invert').value);
  const started = performance.now();
  try {
    const answer = await api(`/predict?include_pixels=true&invert=${invert}`, {
      method: 'POST',
      body: form,
    });
    if (seq !== state.predictSeq) return;
    const ms = Math.round(performance.now() - started);
    renderResults(files, answer);
    const where = state.device ? ` on ${state.device}` : '';
    status.textContent =
      `${answer.model_name} version ${answer.model_version}${where} answered ` +
      `${answer.predictions.length} image${answer.predictions.length === 1 ? '' : 's'} in ${ms} ms.`;
  } catch (err) {
    if (seq !== state.predictSeq) return;
    renderResults([], null);
    status.textContent = '';
    showError(error, err);
  }
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

function modelInputCanvas(pixels) {
  const canvas = el('canvas', {
    class: 'model-input',
    width: '28',
    height: '28',
    role: 'img',
    'aria-label': 'The 28 by 28 grayscale image the model received',
  });
  const context = canvas.getContext('2d');
  const image = context.createImageData(28, 28);
  pixels.flat().forEach((value, i) => {
    image.data.set([value, value, value, 255], i * 4);
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
  const received = el(
    'figure',
    {},
    modelInputCanvas(row.pixels),
    el('figcaption', { text: 'What the model received (28×28)' }),
  );
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
  return el(
    'article',
    { class: 'card', 'data-label': row.label },
    el('h3', { class: 'card-title', text: name }),
    el('div', { class: 'pair' }, original, received),
    el(
      'p',
      { class: 'prediction' },
      'Predicted: ',
      el('strong', { class: 'predicted-label', text: row.label }),
      ` (${percent(top)})`,
    ),
    bars,
    el('p', {
      class: 'answered-by',
      text: `Answered by ${answer.model_name} version ${answer.model_version}` +
        (state.device ? ` on ${state.device}` : ''),
    }),
  );
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
    if (files.length > 0) {
      event.preventDefault();
      classify(files);
    } else if (!event.target.closest('input, select, textarea')) {
      showError(
        $('try-error'),
        new ApiError('The clipboard holds no image: copy an image itself (not its address) and paste again.'),
      );
    }
  });
}

function setUpDrawing() {
  const pad = $('pad');
  const context = pad.getContext('2d');
  const clear = () => {
    context.fillStyle = '#fff';
    context.fillRect(0, 0, pad.width, pad.height);
    state.padDirty = false;
  };
  clear();
  context.lineWidth = 18;
  context.lineCap = 'round';
  context.lineJoin = 'round';
  context.strokeStyle = '#000';
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
    clear();
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
  { title: 'Test accuracy', numeric: true, cell: (v) => (typeof v.accuracy === 'number' ? percent(v.accuracy, 2) : '–') },
  { title: 'Test images', numeric: true, cell: (v) => integer(v.examples) },
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
  table.tHead.rows[0].replaceChildren(
    ...columns.map((column) => el('th', { scope: 'col', text: column.title })),
  );
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

function renderReport(report) {
  const evaluation = report.evaluation;
  const plotUrl = (plot) =>
    `${modelPath()}/versions/${encodeURIComponent(report.version)}/plots/${encodeURIComponent(plot)}`;
  $('report-title').textContent = `Version ${report.version} of ${report.model_name}`;
  const params = evaluation.params || {};
  const facts = [
    ['Test accuracy', `${percent(evaluation.accuracy, 2)} on ${integer(evaluation.examples)} ${evaluation.split || 'test'} images`],
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
  $('per-class').tBodies[0].replaceChildren(
    ...evaluation.per_class.map((row) =>
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
  const hasConfusionPng = report.plots.includes('confusion_matrix.png');
  $('confusion-png-line').hidden = !hasConfusionPng;
  if (hasConfusionPng) $('confusion-png').href = plotUrl('confusion_matrix.png');
  const curves = $('learning-curves');
  if (report.plots.includes('learning_curves.png')) {
    const image = el('img', {
      src: plotUrl('learning_curves.png'),
      alt: `Learning curves of version ${report.version}: loss and accuracy against the training step, for the training batches and for the evaluations on the test split`,
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

async function start() {
  window.addEventListener('error', (event) => showError($('page-error'), event.message));
  window.addEventListener('unhandledrejection', (event) => showError($('page-error'), event.reason));
  setUpFiles();
  setUpDrawing();
  $('refresh-versions').addEventListener('click', async () => {
    await refreshReadiness();
    await loadVersions();
  });
  try {
    await refreshReadiness();
    const { models } = await api('/page/models');
    state.modelName = models[0];
    $('model-name').textContent = state.modelName;
    document.title = `${state.modelName}: try and inspect the model`;
    await loadVersions();
  } catch (err) {
    showError($('inspect-error'), err);
  } finally {
    // Tests wait for this: the first look at the service is over, whatever it found.
    document.body.dataset.ready = 'true';
  }
}

start();
