// gae view: the run, step and sample pages, drawn from the server's JSON (no library, nothing loaded from outside).
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const hover = document.getElementById("hover");
let timer = null;   // the poll of the page shown, cleared when another is shown
let route = 0;      // bumped on each navigation: an answer for a page left is dropped

// ---------------------------------------------------------------- helpers

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attributes) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  return node;
}

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5)) return value.toExponential(3);
  return value.toFixed(digits);
}

async function getJSON(url) {
  const answer = await fetch(url, { cache: "no-store" });
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

function poll(step, delay) {
  clearTimeout(timer);
  timer = setTimeout(step, delay);
}

function progressLine(progress) {
  const total = progress.phase === "figures" ? progress.steps : progress.total_rows;
  const done = progress.phase === "figures" ? progress.steps_done : progress.rows;
  const share = progress.phase === "done" ? 1 : total ? Math.min(1, done / total) : 0;
  const what = progress.phase === "statistics" || progress.phase === "scores"
    ? `statistics over the whole run: ${done} of ${total} rows`
    : `figures: ${progress.steps_done} of ${progress.steps} steps`;
  return el("div", { class: "progress", id: "progress", "data-phase": progress.phase },
    el("span", { class: "bar" }, el("span", { style: `width:${(100 * share).toFixed(1)}%` })), " ", what,
    progress.error ? el("span", { class: "error" }, " ", progress.error) : null);
}

// The diverging scale of the strips: x / scale clamped to [-1, 1]; white at 0, blue (33,102,172) at +1,
// red (178,24,43) at -1, mixed linearly, each channel rounded (docs/view.md says the same).
function colour(x, scale) {
  if (x === null || x === undefined) return "rgb(224, 224, 224)";
  const t = scale > 0 ? Math.max(-1, Math.min(1, x / scale)) : 0;
  const end = t >= 0 ? [33, 102, 172] : [178, 24, 43];
  const a = Math.abs(t);
  const [r, g, b] = end.map((channel) => Math.round(255 + (channel - 255) * a));
  return `rgb(${r}, ${g}, ${b})`;
}

function largest(...lists) {
  let found = 0;
  for (const list of lists) for (const x of list || []) if (x !== null && Math.abs(x) > found) found = Math.abs(x);
  return found;
}

// ---------------------------------------------------------------- charts

function lineChart(title, series, options = {}) {
  const width = options.width || 260, height = options.height || 110, pad = 26;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && Number.isFinite(v));
  const box = el("div", { class: "chart", "data-chart": options.id || title }, el("div", { class: "title" }, title));
  const plot = svg("svg", { width, height });
  box.append(plot);
  if (!all.length) { box.append(el("div", { class: "muted" }, "no data yet")); return box; }
  let low = Math.min(...all), high = Math.max(...all);
  if (low === high) { low -= 1; high += 1; }
  const count = Math.max(...series.map((s) => s.values.length));
  const x = (i) => pad + (count > 1 ? (i * (width - pad - 6)) / (count - 1) : (width - pad) / 2);
  const y = (v) => height - 14 - ((v - low) / (high - low)) * (height - 24);
  plot.append(svg("line", { x1: pad, x2: width - 4, y1: y(low), y2: y(low), stroke: "#ccc" }));
  for (const value of [low, high]) {
    const label = svg("text", { x: 2, y: y(value) + 4, "font-size": 9, fill: "#777" });
    label.textContent = fmt(value, 3);
    plot.append(label);
  }
  for (const s of series) {
    const points = s.values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
    plot.append(svg("polyline", { points: points.join(" "), stroke: s.colour, "data-series": s.name }));
    if (options.onclick) {
      s.values.forEach((v, i) => {
        if (v === null) return;
        const dot = svg("circle", { cx: x(i), cy: y(v), r: 3, fill: s.colour });
        dot.addEventListener("click", () => options.onclick(i));
        plot.append(dot);
      });
    }
  }
  if (series.length > 1) {
    box.append(el("div", { class: "legend" },
      series.map((s) => el("span", { style: `color:${s.colour}` }, "— ", s.name, "  "))));
  }
  return box;
}

// ---------------------------------------------------------------- the run page

const RUN_CHARTS = [
  ["changed_share", "samples changed (share)"],
  ["lost_terminal_samples", "terminal rewards lost (old side)"],
  ["mean_abs_delta_advantage", "mean |Δ advantage|"],
  ["masked_share", "masked share"],
  ["reward_mean", "reward mean"],
];

async function showRun(mine) {
  crumbs.textContent = "";
  const run = await getJSON("/api/run");
  if (mine !== route) return;
  const comparison = run.comparisons[0];
  const stepsIndex = run.files.map((f) => f.index);
  const charts = el("div", { class: "charts", id: "charts" },
    RUN_CHARTS.map(([key, title]) => lineChart(title, [{
      name: key, colour: "#1565c0",
      values: run.files.map((f) => (f.figures ? f.figures[0][key] : null)),
    }], { id: key, onclick: (i) => { location.hash = `#/step/${stepsIndex[i]}`; } })));
  const head = el("tr", {}, ["step", "file", "rows", "row groups", "MB", "samples changed", "terminal lost",
    "mean |Δ|", "max |Δ|", "masked share", "reward mean"].map((t, i) => el("th", { class: i === 1 ? "name" : "" }, t)));
  const rows = run.files.map((f) => {
    const g = f.figures ? f.figures[0] : null;
    const cells = f.error
      ? [el("td", { class: "name", colspan: 9 }, el("span", { class: "error" }, f.error))]
      : [f.rows, f.row_groups, f.bytes / 1e6, g ? g.changed_samples : "…", g ? g.lost_terminal_samples : "…",
        g ? g.mean_abs_delta_advantage : "…", g ? g.max_abs_delta_advantage : "…", g ? g.masked_share : "…",
        g ? g.reward_mean : "…"].map((v) => el("td", {}, fmt(v)));
    return el("tr", { class: f.error ? "" : "link", "data-index": f.index,
      onclick: f.error ? null : () => { location.hash = `#/step/${f.index}`; } },
    el("td", {}, f.index), el("td", { class: "name" }, f.name), cells);
  });
  main.replaceChildren(
    el("h1", {}, `Run: ${run.files.length} steps · new ${run.new} against ${comparison}`),
    progressLine(run.progress), charts,
    el("table", { id: "files" }, el("thead", {}, head), el("tbody", {}, rows)));
  if (!["done", "failed"].includes(run.progress.phase)) poll(() => showRun(mine), 700);
}

// ---------------------------------------------------------------- the step page

const STEP_COLUMNS = [
  ["row", "row"], ["id", "id"], ["group", "group"], ["length", "length"], ["trainable_tokens", "trainable"],
  ["masked_share", "masked share"], ["masked_tail", "masked tail"], ["max_abs_delta_advantage", "max |Δ|"],
  ["mean_abs_delta_advantage", "mean |Δ|"], ["sign_flips", "sign flips"], ["terminal_credit", "terminal credit"],
  ["lost_terminal", "terminal lost"], ["changed", "changed"], ["reward", "reward"],
];

const stepState = { sort: "max_abs_delta_advantage", descending: true, minDelta: "", flag: "all", group: "", minLength: "" };

function stepRows(samples) {
  const count = samples.row.length;
  let order = [...Array(count).keys()];
  const minDelta = parseFloat(stepState.minDelta), minLength = parseInt(stepState.minLength, 10);
  order = order.filter((i) => {
    if (Number.isFinite(minDelta) && !(samples.max_abs_delta_advantage[i] >= minDelta)) return false;
    if (Number.isFinite(minLength) && !(samples.length[i] >= minLength)) return false;
    if (stepState.flag === "changed" && !samples.changed[i]) return false;
    if (stepState.flag === "lost" && !samples.lost_terminal[i]) return false;
    if (stepState.flag === "tail" && !(samples.masked_tail[i] > 0)) return false;
    if (stepState.group !== "" && samples.group && String(samples.group[i]) !== stepState.group) return false;
    return true;
  });
  const values = samples[stepState.sort] || samples.row;
  const key = (v) => (v === null || v === undefined ? -Infinity : typeof v === "boolean" ? Number(v) : v);
  order.sort((a, b) => {
    const x = key(values[a]), y = key(values[b]);
    const c = x < y ? -1 : x > y ? 1 : samples.row[a] - samples.row[b];
    return stepState.descending && x !== y ? -c : c;
  });
  return order;
}

function samplesTable(index, samples, side) {
  const columns = STEP_COLUMNS.filter(([key]) => key in samples);
  const head = el("tr", {}, columns.map(([key, title]) => el("th", {
    "data-key": key,
    class: key === stepState.sort ? (stepState.descending ? "sorted-desc" : "sorted-asc") : "",
    onclick: () => {
      stepState.descending = stepState.sort === key ? !stepState.descending : true;
      stepState.sort = key;
      document.getElementById("samples").replaceWith(samplesTable(index, samples, side));
    },
  }, title)));
  const body = stepRows(samples).map((i) => el("tr", {
    class: "link", "data-row": samples.row[i],
    onclick: () => { location.hash = `#/sample/${index}/${samples.row[i]}?old=side:${side}`; },
  }, columns.map(([key]) => el("td", { "data-key": key }, fmt(samples[key][i])))));
  return el("table", { id: "samples" }, el("thead", {}, head), el("tbody", {}, body));
}

function filterControls(index, samples, side) {
  const redraw = () => document.getElementById("samples").replaceWith(samplesTable(index, samples, side));
  const input = (id, key, placeholder) => el("input", {
    id, placeholder, value: stepState[key], oninput: (event) => { stepState[key] = event.target.value; redraw(); },
  });
  const flag = el("select", { id: "filter-flag", onchange: (event) => { stepState.flag = event.target.value; redraw(); } },
    [["all", "all samples"], ["changed", "changed"], ["lost", "terminal reward lost"], ["tail", "masked tail"]]
      .map(([value, text]) => el("option", { value, ...(value === stepState.flag ? { selected: "" } : {}) }, text)));
  return el("div", { class: "filters" },
    el("label", {}, "max |Δ| ≥ ", input("filter-min-delta", "minDelta", "0")),
    el("label", {}, "length ≥ ", input("filter-min-length", "minLength", "0")),
    samples.group ? el("label", {}, "group = ", input("filter-group", "group", "any")) : null, flag);
}

function figuresList(summary, keys) {
  return el("dl", { class: "figures", id: "summary" },
    keys.flatMap((key) => [el("dt", {}, key.replaceAll("_", " ")), el("dd", { "data-key": key }, fmt(summary[key]))]));
}

async function showStep(mine, index, side) {
  crumbs.replaceChildren(" / ", el("a", { href: `#/step/${index}` }, `step ${index}`));
  const step = await getJSON(`/api/step/${index}?side=${side}`);
  if (mine !== route) return;
  if (step.error) { main.replaceChildren(el("h1", {}, step.name), el("p", { class: "error" }, step.error)); return; }
  if (!step.ready) {
    main.replaceChildren(el("h1", {}, `Step ${index}: ${step.name}`), el("p", {}, "computing this step's figures…"),
      progressLine(step.progress));
    poll(() => showStep(mine, index, side), 300);
    return;
  }
  const sides = el("select", { id: "side", onchange: (event) => { location.hash = `#/step/${index}?side=${event.target.value}`; } },
    step.comparisons.map((name, k) => el("option", { value: k, ...(k === side ? { selected: "" } : {}) }, name)));
  const groups = step.groups && step.groups.length
    ? el("table", { id: "groups" },
      el("thead", {}, el("tr", {}, ["group", "samples", "changed", "max |Δ|", "mean |Δ|"].map((t) => el("th", {}, t)))),
      el("tbody", {}, step.groups.map((g) => el("tr", { class: "link", onclick: () => {
        stepState.group = String(g.key);
        document.getElementById("filter-group").value = stepState.group;
        document.getElementById("samples").replaceWith(samplesTable(index, step.samples, side));
      } }, [g.key, g.samples, g.changed_samples, g.max_abs_delta_advantage, g.mean_abs_delta_advantage]
        .map((v) => el("td", {}, fmt(v)))))))
    : null;
  main.replaceChildren(
    el("h1", {}, `Step ${index}: ${step.name}`),
    el("div", { class: "nav" }, "old side: ", sides),
    figuresList(step.summary, ["samples", "changed_samples", "lost_terminal_samples", "mean_abs_delta_advantage",
      "max_abs_delta_advantage", "trainable_share", "masked_tail_samples"]),
    groups ? el("h2", {}, "Groups hit hardest") : null, groups,
    el("h2", {}, "Samples"), filterControls(index, step.samples, side), samplesTable(index, step.samples, side));
}

// ---------------------------------------------------------------- the sample page

const STRIPS = [
  ["new", "new advantage", "new_advantages"],
  ["old", "old advantage", "old_advantages"],
  ["delta", "Δ = new − old", "delta"],
  ["values", "values", "values"],
  ["rewards", "rewards", "rewards"],
  ["returns", "new returns", "new_returns"],
];

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

// The turn a position is in: how many turns start at or before it (0 before the first).
function turnOf(sample, position) {
  return sample.turn_starts.filter((start) => start <= position).length;
}

function showHover(sample, position, event) {
  const numbers = [["position", position], ["turn", turnOf(sample, position) || null],
    ["token", sample.tokens ? JSON.stringify(sample.tokens[position]) : null],
    ["trainable", sample.mask[position] ? "yes" : "no (masked)"], ["new advantage", sample.new_advantages[position]],
    ["old advantage", sample.old_advantages[position]], ["Δ", sample.delta[position]],
    ["value", sample.values ? sample.values[position] : null], ["reward", sample.rewards ? sample.rewards[position] : null],
    ["new return", sample.new_returns ? sample.new_returns[position] : null],
    ["old return", sample.old_returns ? sample.old_returns[position] : null]];
  hover.replaceChildren(...numbers.filter(([, v]) => v !== null && v !== undefined)
    .map(([name, v]) => el("div", { "data-key": name }, `${name}: ${typeof v === "number" ? fmt(v, 6) : v}`)));
  hover.hidden = false;
  hover.style.left = `${Math.min(event.clientX + 12, window.innerWidth - 260)}px`;
  hover.style.top = `${event.clientY + 14}px`;
}

function strip(sample, key, values, scale) {
  const node = el("div", { class: "strip", id: `strip-${key}`, "data-scale": scale });
  const turns = new Set(sample.turn_starts), spans = new Set(sample.masked_starts);
  values.forEach((value, position) => {
    const masked = !sample.mask[position];
    const text = sample.tokens ? sample.tokens[position].replaceAll("\n", "⏎") : "\u00a0";
    node.append(el("span", {
      class: `tok${masked ? " masked" : ""}${turns.has(position) ? " turn-start" : ""}${spans.has(position) ? " masked-start" : ""}`,
      "data-pos": position, "data-value": value === null ? "" : value,
      style: `background-color:${colour(value, scale)}`,
    }, text));
  });
  node.addEventListener("mouseover", (event) => {
    const token = event.target.closest(".tok");
    if (token) showHover(sample, Number(token.dataset.pos), event);
  });
  node.addEventListener("mouseleave", () => { hover.hidden = true; });
  return node;
}

function navButton(id, label, index, row, old) {
  return el("button", {
    id, disabled: row === null || row === undefined ? "" : null,
    onclick: () => { location.hash = `#/sample/${index}/${row}?old=${encodeURIComponent(old)}`; },
  }, label);
}

function sampleHeader(sample, index) {
  const nav = sample.navigation;
  const old = sample.old;
  const choose = el("select", {
    id: "old-side",
    onchange: (event) => { location.hash = `#/sample/${index}/${sample.row}?old=${encodeURIComponent(event.target.value)}`; },
  }, sample.choices.map((c) => el("option", { value: c.key, ...(c.key === old ? { selected: "" } : {}) }, c.label)));
  const buttons = nav
    ? [navButton("prev-group", "◀ group", index, nav.prev_group, old), navButton("next-group", "group ▶", index, nav.next_group, old),
      navButton("prev-rank", "◀ rank", index, nav.prev_rank, old), navButton("next-rank", "rank ▶", index, nav.next_rank, old),
      el("span", { id: "rank" }, `rank ${nav.rank} of ${nav.of} by max |Δ|`),
      nav.group !== null ? el("span", {}, ` · group ${nav.group} (${nav.group_size} samples)`) : null]
    : [el("span", { class: "muted", id: "nav-waiting" }, "navigation once the step's figures are done…")];
  return el("div", { class: "nav" }, "old side: ", choose, ...buttons);
}

function sampleChart(sample) {
  return lineChart("advantages along the response", [
    { name: "new", colour: "#1565c0", values: sample.new_advantages },
    { name: `old (${sample.old_name})`, colour: "#c62828", values: sample.old_advantages },
  ], { id: "along", width: Math.min(900, Math.max(300, 6 * sample.length)), height: 160 });
}

async function showSample(mine, index, row, old) {
  crumbs.replaceChildren(" / ", el("a", { href: `#/step/${index}` }, `step ${index}`), " / ", `row ${row}`);
  const query = old ? `?old=${encodeURIComponent(old)}` : "";
  let sample;
  try {
    sample = await getJSON(`/api/sample/${index}/${row}${query}`);
  } catch (error) {
    if (mine === route) main.replaceChildren(el("h1", {}, `Step ${index}, row ${row}`), el("p", { class: "error" }, error.message));
    return;
  }
  if (mine !== route) return;
  if (sample.error) { main.replaceChildren(el("p", { class: "error" }, sample.error)); return; }
  if (!sample.ready) {
    main.replaceChildren(el("h1", {}, `Step ${index}, row ${row}`), progressLine(sample.progress));
    poll(() => showSample(mine, index, row, old), 400);
    return;
  }
  const shared = largest(sample.new_advantages, sample.old_advantages);
  const strips = STRIPS.filter(([, , field]) => sample[field]).flatMap(([key, title, field]) => {
    const scale = key === "new" || key === "old" ? shared : largest(sample[field]);
    return [el("div", { class: "strip-label" }, `${title} (scale ±${fmt(scale, 4)})`), strip(sample, key, sample[field], scale)];
  });
  const trainable = sample.mask.reduce((a, b) => a + b, 0);
  main.replaceChildren(
    el("h1", {}, `Step ${index} (${sample.name}), row ${row}`, sample.id !== null ? ` · id ${sample.id}` : ""),
    sampleHeader(sample, index),
    el("p", { id: "facts" }, `${sample.length} tokens, ${trainable} trainable · terminal reward ${fmt(sample.terminal_reward)}`,
      ` · text: ${sample.tokens_from} · old side: ${sample.old_name}`),
    el("p", { class: "legend", id: "legend" }, "blue > 0 > red, white at 0; masked tokens dimmed; a solid bar marks where a turn ",
      `starts (${plural(sample.turn_starts.length, "turn")}, from the ${sample.turns_from === "ids" ? "turn ids" : "mask's runs"}), `,
      `a dashed one where a masked span starts (${plural(sample.masked_starts.length, "span")}).`),
    ...strips, sampleChart(sample));
  if (!sample.navigation) poll(() => refreshNavigation(mine, index, row, old), 700);
}

// Until the step's figures are done the sample page has no neighbours: ask again, and put them in when they come.
async function refreshNavigation(mine, index, row, old) {
  const query = old ? `?old=${encodeURIComponent(old)}` : "";
  const sample = await getJSON(`/api/sample/${index}/${row}${query}`);
  if (mine !== route) return;
  if (sample.navigation) document.querySelector("main .nav").replaceWith(sampleHeader(sample, index));
  else poll(() => refreshNavigation(mine, index, row, old), 700);
}

// ---------------------------------------------------------------- routing

function show() {
  clearTimeout(timer);
  hover.hidden = true;
  route += 1;
  const mine = route;
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = (path || "/").split("/").filter(Boolean);
  const failed = (error) => { if (mine === route) main.replaceChildren(el("p", { class: "error" }, error.message)); };
  if (parts[0] === "step") showStep(mine, Number(parts[1]), Number(params.get("side") || 0)).catch(failed);
  else if (parts[0] === "sample") showSample(mine, Number(parts[1]), Number(parts[2]), params.get("old")).catch(failed);
  else showRun(mine).catch(failed);
}

window.addEventListener("hashchange", show);
show();
