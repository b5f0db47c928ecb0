// The nodeledger page: polls the REST API and draws every node of the current page as one
// stacked bar per resource. Plain ES module, no dependencies, no build step.
//
// URL query: ?limit=N (nodes per page, 1-1000, default 50), ?q=, ?sort=name|free_cpu|free_memory.

const POLL_MS = 2000;
const EVENTS_SHOWN = 50;
const EVENTS_WINDOW_MS = 15 * 60 * 1000; // what the first load shows
const EVENTS_PAGE = 500;
// PostgreSQL numbers events at insert, not at commit: a later poll re-reads the last few ids
// so an event that committed late still shows (duplicates are dropped by id).
const EVENTS_REREAD = 20;
const SORTS = ["name", "free_cpu", "free_memory"];
const TOKEN_KEY = "nodeledger.token";

// [key in the node JSON, class, legend label]
const SEGMENTS = [
  ["held_by_kubernetes", "kubernetes", "Kubernetes"],
  ["held_by_slurm", "slurm", "Slurm"],
  ["held_manually", "manual", "manual"],
  ["reserved", "reserved", "reserved"],
];
// [resource name, base-unit field of Amounts, display field of Amounts, heading]
const RESOURCES = [
  ["cpu", "cpu_millis", "cpu", "CPU"],
  ["memory", "memory_bytes", "memory", "Memory"],
  ["gpu", "gpu", "gpu", "GPUs"],
];

const $ = (id) => document.getElementById(id);

function intParam(value, min, max, fallback) {
  const n = Number.parseInt(value ?? "", 10);
  return Number.isInteger(n) && n >= min && n <= max ? n : fallback;
}

const query = new URLSearchParams(location.search);
const state = {
  limit: intParam(query.get("limit"), 1, 1000, 50),
  q: (query.get("q") ?? "").trim(),
  sort: SORTS.includes(query.get("sort")) ? query.get("sort") : "name",
  starts: [null], // starts[i]: the cursor that starts page i (null: the first page)
  page: 0,
  next: null, // X-Next-Cursor of the page shown
  generation: 0, // bumped when the listing changes; older answers are dropped
  lastEventId: null,
  eventsSince: new Date(Date.now() - EVENTS_WINDOW_MS).toISOString(),
  events: new Map(), // id -> event
  rows: new Map(), // node name -> {signature, row}
  token: sessionStorage.getItem(TOKEN_KEY),
  timer: null,
  lastUpdate: null,
};

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function detailOf(body) {
  if (body && typeof body.detail === "string") return body.detail;
  if (body && Array.isArray(body.detail)) {
    return body.detail.map((e) => `${(e.loc ?? []).join(".")}: ${e.msg}`).join("; ");
  }
  return "";
}

async function api(path) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  let response;
  try {
    response = await fetch(path, { headers, cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, `cannot reach the service (${err.message})`);
  }
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw new ApiError(response.status, detailOf(body) || response.statusText);
  }
  return { body: await response.json(), headers: response.headers };
}

// ---- nodes -------------------------------------------------------------------------------

function nodesPath() {
  const p = new URLSearchParams({ limit: String(state.limit), sort: state.sort });
  if (state.q) p.set("q", state.q);
  const start = state.starts[state.page];
  if (start) p.set("cursor", start);
  return `/v1/nodes?${p}`;
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function bar(node, [resource, base, shown, heading]) {
  const cell = element("td", `resource ${resource}`);
  const capacity = node.capacity[base];
  const free = node.free[base];
  const parts = SEGMENTS.map(([key, cls, label]) => ({
    cls,
    label,
    value: node[key][base],
    text: String(node[key][shown]),
  }));
  const used = parts.reduce((sum, p) => sum + p.value, 0);
  // Overcommitted (free < 0): the bar spans what is held and reserved, beyond capacity.
  const scale = Math.max(capacity, used, 1);
  parts.push({ cls: "free", label: "free", value: Math.max(free, 0), text: String(node.free[shown]) });

  const summary =
    capacity === 0
      ? `${heading} on ${node.name}: none`
      : `${heading} on ${node.name}: capacity ${node.capacity[shown]}; ` +
        parts.map((p) => `${p.label} ${p.text}`).join(", ");
  const track = element("div", "bar");
  track.setAttribute("role", "img");
  track.setAttribute("aria-label", summary);
  track.title = summary;
  track.dataset.resource = resource;
  for (const p of parts) {
    if (p.value <= 0) continue;
    const segment = element("span", `segment ${p.cls}`);
    segment.style.width = `${(100 * p.value) / scale}%`;
    track.append(segment);
  }
  cell.append(track);

  const numbers = element("div", "numbers");
  if (capacity === 0) {
    numbers.textContent = "none";
  } else {
    numbers.append("free ", element("strong", "", String(node.free[shown])));
    numbers.append(` of ${node.capacity[shown]}`);
    const k8s = node.held_by_kubernetes[base];
    const slurm = node.held_by_slurm[base];
    if (k8s > 0) numbers.append(element("span", "tag kubernetes", `K8s ${node.held_by_kubernetes[shown]}`));
    if (slurm > 0) numbers.append(element("span", "tag slurm", `Slurm ${node.held_by_slurm[shown]}`));
    if (free < 0) numbers.append(element("span", "tag over", "overcommitted"));
  }
  cell.append(numbers);
  return cell;
}

// The Kubernetes headroom: what is kept withheld from Slurm for pods (target) and what of
// it is left to admit without a Slurm call (free). "none" while the headroom is off or idle.
function headroomCell(node) {
  const cell = element("td", "headroom");
  const { target, granted, free } = node.headroom;
  const shown = RESOURCES.filter(([, base]) => target[base] > 0 || granted[base] > 0);
  if (shown.length === 0) {
    cell.classList.add("none");
    cell.textContent = "none";
    cell.title = `Headroom on ${node.name}: none`;
    return cell;
  }
  const parts = [];
  for (const [, base, display, heading] of shown) {
    const line = element("div", "headroom-line");
    line.dataset.resource = display;
    line.append(element("span", "label", heading), ` ${target[display]} / `);
    line.append(element("strong", "", String(free[display])));
    cell.append(line);
    parts.push(`${heading} target ${target[display]}, free ${free[display]}`);
  }
  cell.title = `Headroom on ${node.name}: ${parts.join("; ")}`;
  return cell;
}

// Which holder has which GPU device: holdings that name their devices, with each
// device's UUID in the tooltip when known. GPUs held by count only are in the GPU bar alone.
function gpuDevices(node) {
  const held = [];
  for (const holding of node.holdings) {
    const holder = holding.holder.name || holding.holder.id;
    for (const device of holding.devices) held.push([device.index, holder, holding, device.uuid]);
  }
  if (held.length === 0) return null;
  held.sort((a, b) => a[0] - b[0]);
  const span = element("span", "sub gpu-devices");
  span.textContent = held.map(([device, holder]) => `GPU ${device}: ${holder}`).join(" · ");
  span.title = held
    .map(([device, holder, holding, uuid]) => {
      const gpu = uuid ? `GPU device ${device} (${uuid})` : `GPU device ${device}`;
      const hold = holding.slurm_hold ? `, Slurm hold job ${holding.slurm_hold}` : "";
      return `${gpu} on ${node.name}: ${holding.holder.kind} ${holder}${hold}`;
    })
    .join("; ");
  return span;
}

function nodeRow(node) {
  const row = element("tr");
  row.dataset.node = node.name;
  const name = element("th", "name");
  name.scope = "row";
  name.append(element("span", "node-name", node.name));
  if (node.slurm_name && node.slurm_name !== node.name) {
    name.append(element("span", "sub", `Slurm: ${node.slurm_name}`));
  }
  const count = node.holdings.length;
  name.append(element("span", "sub", `${count} holding${count === 1 ? "" : "s"}`));
  const devices = gpuDevices(node);
  if (devices) name.append(devices);
  row.append(name);
  for (const resource of RESOURCES) row.append(bar(node, resource));
  row.append(headroomCell(node));
  const admissible = element("td", node.admissible ? "admissible yes" : "admissible no");
  admissible.append(element("span", "verdict", node.admissible ? "yes" : "no"));
  if (node.reason) admissible.append(element("span", "reason", node.reason));
  row.append(admissible);
  return row;
}

function signature(node) {
  // Everything drawn; timestamps alone do not redraw a row.
  const { created_at, updated_at, holdings, headroom, ...rest } = node;
  const { used_at, ...figures } = headroom;
  const devices = holdings
    .filter((h) => h.devices.length > 0)
    .map((h) => [h.holder.id, h.holder.name, h.devices, h.slurm_hold]);
  return JSON.stringify([rest, figures, holdings.length, devices]);
}

function renderNodes(nodes) {
  const rows = new Map();
  const ordered = nodes.map((node) => {
    const sig = signature(node);
    const known = state.rows.get(node.name);
    const row = known && known.signature === sig ? known.row : nodeRow(node);
    rows.set(node.name, { signature: sig, row });
    return row;
  });
  state.rows = rows;
  document.querySelector("#nodes tbody").replaceChildren(...ordered);
  $("empty").hidden = nodes.length > 0;
  $("prev").disabled = state.page === 0;
  $("next").disabled = !state.next;
  $("page-info").textContent = `Page ${state.page + 1}`;
}

// ---- events ------------------------------------------------------------------------------

async function loadEvents() {
  for (let round = 0; round < 10; round += 1) {
    const p = new URLSearchParams({ limit: String(EVENTS_PAGE) });
    if (state.lastEventId === null) p.set("since", state.eventsSince);
    else p.set("after", String(Math.max(0, state.lastEventId - EVENTS_REREAD)));
    const { body } = await api(`/v1/events?${p}`);
    for (const event of body) {
      state.events.set(event.id, event);
      state.lastEventId = Math.max(state.lastEventId ?? 0, event.id);
    }
    if (body.length < EVENTS_PAGE) break;
  }
  const keep = [...state.events.keys()].sort((a, b) => b - a).slice(0, EVENTS_SHOWN);
  state.events = new Map(keep.map((id) => [id, state.events.get(id)]));
}

function renderEvents() {
  const items = [...state.events.values()].map((event) => {
    const item = element("li", `event ${event.kind}`);
    item.dataset.id = String(event.id);
    const at = element("time", "", new Date(event.at).toLocaleTimeString());
    at.dateTime = event.at;
    const kind = event.kind.replaceAll("_", " ");
    item.append(at, element("span", "kind", kind));
    if (event.node) item.append(element("span", "node", event.node));
    if (event.message !== kind) item.append(element("span", "message", event.message));
    return item;
  });
  $("events").replaceChildren(...items);
  $("no-events").hidden = items.length > 0;
}

// ---- polling -----------------------------------------------------------------------------

function showProblem(err) {
  const problem = $("problem");
  let text;
  if (err.status === 401) {
    text =
      "The API asks for credentials (HTTP 401): reads are protected on this service " +
      `(NODELEDGER_AUTH_PROTECT_READS). Enter a bearer token below. The service said: ${err.message}`;
  } else if (err.status === 403) {
    text = `This token may not read the ledger (HTTP 403): ${err.message}`;
  } else if (err.status) {
    text = `The API answered HTTP ${err.status}: ${err.message}`;
  } else {
    text = `The service cannot be reached: ${err.message}. Retrying every ${POLL_MS / 1000} s.`;
  }
  if (problem.textContent !== text) problem.textContent = text;
  problem.hidden = false;
  $("auth").hidden = !(err.status === 401 || err.status === 403);
  const since = state.lastUpdate ? ` since ${state.lastUpdate.toLocaleTimeString()}` : "";
  $("status").textContent = `Not updated${since}`;
}

function clearProblem() {
  $("problem").hidden = true;
  $("problem").textContent = "";
  $("auth").hidden = true;
}

async function refresh() {
  clearTimeout(state.timer);
  const generation = state.generation;
  try {
    const [nodes] = await Promise.all([api(nodesPath()), loadEvents()]);
    if (generation !== state.generation) return; // the listing changed meanwhile
    state.next = nodes.headers.get("X-Next-Cursor");
    renderNodes(nodes.body);
    renderEvents();
    clearProblem();
    state.lastUpdate = new Date();
    const shown = `${nodes.body.length} node${nodes.body.length === 1 ? "" : "s"} on this page`;
    $("status").textContent = `${shown} · updated ${state.lastUpdate.toLocaleTimeString()}`;
  } catch (err) {
    if (generation !== state.generation) return;
    if (!(err instanceof ApiError)) throw err;
    showProblem(err);
  } finally {
    if (generation === state.generation) state.timer = setTimeout(refresh, POLL_MS);
  }
}

function relist() {
  // The filter, the sort or the page changed: show it now, drop answers for the old one.
  state.generation += 1;
  const p = new URLSearchParams(location.search);
  p.set("limit", String(state.limit));
  p.set("sort", state.sort);
  if (state.q) p.set("q", state.q);
  else p.delete("q");
  history.replaceState(null, "", `?${p}`);
  refresh();
}

function start() {
  $("q").value = state.q;
  $("sort").value = state.sort;
  let typing = null;
  $("q").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.q = $("q").value.trim();
      state.starts = [null];
      state.page = 0;
      relist();
    }, 250);
  });
  $("controls").addEventListener("submit", (e) => e.preventDefault());
  $("sort").addEventListener("change", () => {
    state.sort = $("sort").value;
    state.starts = [null]; // a cursor belongs to one sort
    state.page = 0;
    relist();
  });
  $("next").addEventListener("click", () => {
    if (!state.next) return;
    state.starts[state.page + 1] = state.next;
    state.starts.length = state.page + 2;
    state.page += 1;
    relist();
  });
  $("prev").addEventListener("click", () => {
    if (state.page === 0) return;
    state.page -= 1;
    relist();
  });
  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim() || null;
    if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    relist();
  });
  refresh();
}

start();
