// The viewer page: filters and the prompt list on the left, one prompt's branch tree on the right.
// Everything comes from the JSON endpoints of server.py; the state lives in the URL's hash, so
// reloading the page keeps the prompt open and shows the steps written since.
"use strict";

const form = document.getElementById("filters");
const FILTERS = ["run", "algo", "step", "outcome", "tool"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits = 2) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function signed(value) {
  if (value === null || value === undefined) return "–";
  return (value > 0 ? "+" : "") + value.toFixed(2);
}

function readHash() {
  return Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
}

function writeHash(extra) {
  const state = { ...filterValues(), ...extra };
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== "" && value !== undefined) params.set(key, value);
  history.replaceState(null, "", "#" + params.toString());
}

function filterValues() {
  return Object.fromEntries(FILTERS.map((name) => [name, form.elements[name].value]));
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function fillSelect(select, values, keep) {
  const first = select.options[0];
  select.replaceChildren(first, ...values.map((v) => el("option", { value: v }, v)));
  if (values.map(String).includes(keep)) select.value = keep;
}

async function loadRuns(state) {
  const data = await getJSON("/api/runs");
  document.getElementById("root").textContent = data.root;
  const runs = data.runs;
  fillSelect(form.elements.run, runs.map((r) => r.name), state.run || "");
  fillSelect(form.elements.algo, [...new Set(runs.map((r) => r.algo))].sort(), state.algo || "");
  const steps = [...new Set(runs.flatMap((r) => r.steps))].sort((a, b) => a - b);
  fillSelect(form.elements.step, steps.map(String), state.step || "");
  for (const name of ["outcome", "tool"]) form.elements[name].value = state[name] || "";
  const errors = runs.flatMap((r) => r.errors);
  document.getElementById("errors").replaceChildren(...errors.map((e) => el("div", {}, e)));
}

async function loadPrompts(state) {
  const query = new URLSearchParams(filterValues());
  const data = await getJSON("/api/prompts?" + query);
  const nav = document.getElementById("prompts");
  if (!data.prompts.length) {
    nav.replaceChildren(el("p", { class: "hint" }, "No prompt matches the filters."));
    return;
  }
  nav.replaceChildren(...data.prompts.map((p) => {
    const button = el("button", { type: "button", class: "prompt", "data-run": p.run, "data-step": p.step, "data-group": p.group },
      el("div", {}, p.task || p.task_id),
      el("div", { class: "meta" },
        `${p.run} · step ${p.step} · group ${p.group} · ${p.trajectories} trajectories` +
        (p.forks ? ` (${p.forks} forks)` : "") + ` · ${p.correct} correct · mean reward ${fmt(p.reward_mean)}` +
        ` · ${p.tool_calls} tool calls`,
        p.health ? el("span", { class: "badge warn" }, `⚠ ${p.health}`) : null));
    button.addEventListener("click", () => openPrompt(p.run, p.step, p.group));
    return button;
  }));
  markCurrent(state);
}

function markCurrent(state) {
  for (const b of document.querySelectorAll("#prompts button")) {
    b.classList.toggle("current",
      b.dataset.run === state.p_run && b.dataset.step === String(state.p_step) && b.dataset.group === String(state.p_group));
  }
}

// ---- one prompt ----------------------------------------------------------------------------------

function shade(h, scale) {
  const a = scale > 0 ? Math.min(1, h / scale) * 0.85 : 0;
  return `rgba(240,130,20,${a.toFixed(3)})`;
}

function renderTokens(piece, scale) {
  if (piece.tokens) {
    return el("span", { class: "seg" }, piece.tokens.map(([text, h]) =>
      el("span", { class: "tok", title: `H = ${fmt(h, 3)}`, style: `background:${shade(h, scale)}` }, text)));
  }
  const attrs = { class: "seg" };
  if (piece.entropy !== null && piece.entropy !== undefined) {
    attrs.title = `mean H = ${fmt(piece.entropy, 3)} (no tokenizer in the run: shaded per segment)`;
    attrs.style = `background:${shade(piece.entropy, scale)}`;
  }
  return el("span", attrs, piece.text);
}

function lineCount(text) {
  const n = text.trim().split("\n").length;
  return `${n} line${n > 1 ? "s" : ""}`;
}

// A tool call and the result the env inserted after it fold into one line: the tool, the start of
// its argument, and the size of the result; opening it shows the call's tokens and the result.
function renderCall(call, result, scale) {
  const match = call.text.match(/^<([\w-]+)>([\s\S]*?)(<\/[\w-]+>\s*)?$/);
  const tool = match ? match[1] : "tool";
  let arg = match ? match[2].trim().replace(/\s+/g, " ") : call.text.trim();
  if (arg.length > 60) arg = arg.slice(0, 57) + "…";
  return el("details", { class: "tool" },
    el("summary", {}, `${tool}: ${arg} → ${result ? lineCount(result.text) : "no result"}`),
    el("div", { class: "call" }, renderTokens(call, scale)),
    result ? el("pre", {}, result.text) : null);
}

function renderPieces(pieces, scale) {
  const out = [];
  for (let i = 0; i < pieces.length; i++) {
    const piece = pieces[i];
    if (piece.kind === "call") {
      const result = pieces[i + 1] && pieces[i + 1].kind === "env" ? pieces[i + 1] : null;
      out.push(renderCall(piece, result, scale));
      if (result) i++;
    } else if (piece.kind === "env") {
      out.push(el("details", { class: "tool" }, el("summary", {}, `inserted by the env · ${lineCount(piece.text)}`),
        el("pre", {}, piece.text)));
    } else {
      out.push(renderTokens(piece, scale));
    }
  }
  return out;
}

function renderText(t, scale) {
  const shared = t.pieces.filter((p) => p.shared);
  const own = t.pieces.filter((p) => !p.shared);
  const out = el("div", { class: "text" });
  if (shared.length) {
    out.append(el("details", { class: "shared" },
      el("summary", {}, `prefix shared with #${t.parent} · ${t.branch_offset} tokens`),
      el("span", { class: "prefix" }, renderPieces(shared, scale))));
  }
  out.append(...renderPieces(own, scale));
  return out;
}

function renderBody(t, scale) {
  const chips = Object.entries(t.components).map(([k, v]) =>
    el("span", { class: "component" }, el("b", {}, k), " ", fmt(v, 4)));
  return el("div", { class: "body" },
    t.health.length ? el("ul", { class: "health" }, t.health.map((h) => el("li", {}, "⚠ " + h))) : null,
    el("div", { class: "components", title: "reward components: the env's info at the end" }, chips),
    renderText(t, scale));
}

function matchesFilters(t) {
  const f = filterValues();
  if (f.outcome === "correct" && !t.correct) return false;
  if (f.outcome === "incorrect" && t.correct) return false;
  if (f.tool === "used" && !t.tool_calls) return false;
  return !(f.tool === "unused" && t.tool_calls);
}

function renderNode(t, children, scale) {
  const summary = el("summary", {},
    `#${t.id} `,
    el("span", { class: t.correct ? "correct" : "wrong" }, t.correct ? "✓" : "✗"),
    ` reward ${fmt(t.reward)} · advantage ${signed(t.advantage)}`,
    t.parent !== null ? ` · fork of #${t.parent} at token ${t.branch_offset}` : "",
    ` · ${t.tool_calls} tool calls · ${t.generated}/${t.tokens} generated · ${t.end_reason || "–"}`,
    t.kind ? el("span", { class: "badge" }, t.kind) : null,
    t.health.length ? el("span", { class: "badge warn", title: t.health.join("\n") }, `⚠ ${t.health.length}`) : null);
  const details = el("details", { class: "branch", "data-traj": t.id }, summary);
  // the body is built on first open: a prompt can hold hundreds of long trajectories
  details.addEventListener("toggle", () => {
    if (details.open && details.children.length === 1) details.append(renderBody(t, scale));
  });
  const li = el("li", { class: "node" + (matchesFilters(t) ? "" : " dim"), "data-traj": t.id }, details);
  if (children.length) li.append(el("ul", { class: "tree" }, children));
  return li;
}

function renderTree(trajectories, scale) {
  const ids = new Set(trajectories.map((t) => t.id));
  const kids = new Map();
  for (const t of trajectories) {
    const parent = t.parent !== null && ids.has(t.parent) ? t.parent : null;
    if (!kids.has(parent)) kids.set(parent, []);
    kids.get(parent).push(t);
  }
  const build = (t) => renderNode(t, (kids.get(t.id) || []).map(build), scale);
  return el("ul", { class: "tree top" }, (kids.get(null) || []).map(build));
}

async function openPrompt(run, step, group) {
  writeHash({ p_run: run, p_step: step, p_group: group });
  markCurrent(readHash());
  const section = document.getElementById("prompt");
  let p;
  try {
    p = await getJSON(`/api/prompt?${new URLSearchParams({ run, step, group })}`);
  } catch (error) {
    section.replaceChildren(el("p", { class: "hint" }, String(error.message)));
    return;
  }
  const entropies = p.trajectories.flatMap((t) => t.pieces.flatMap((piece) =>
    piece.tokens ? piece.tokens.map(([, h]) => h) : (piece.entropy !== undefined && piece.entropy !== null ? [piece.entropy] : [])));
  const scale = entropies.length ? Math.max(...entropies.filter(Number.isFinite)) : 0;
  const forks = p.trajectories.filter((t) => t.parent !== null).length;
  section.replaceChildren(
    el("h2", { class: "task" }, p.task || p.task_id),
    el("p", { class: "meta" }, `${p.run} (${p.algo}) · step ${p.step} · group ${p.group} · task ${p.task_id} · `,
      el("span", { id: "branch-count" }, `${p.trajectories.length} trajectories`), forks ? `, ${forks} of them forks` : ""),
    p.prompt ? el("details", { class: "prompt-text" }, el("summary", {}, "whole prompt"), el("pre", {}, p.prompt)) : null,
    el("p", { class: "legend" }, "entropy 0 ", el("span", { class: "scale" }), ` ${fmt(scale)}`,
      p.tokenizer ? " (per token)" : " (per segment: no tokenizer in the run)"),
    renderTree(p.trajectories, scale));
}

async function refresh() {
  const state = readHash();
  await loadRuns(state);
  await loadPrompts(state);
  if (state.p_run !== undefined) await openPrompt(state.p_run, state.p_step, state.p_group);
}

form.addEventListener("change", async () => {
  const state = readHash();
  writeHash({ p_run: state.p_run, p_step: state.p_step, p_group: state.p_group });
  await loadPrompts(readHash());
  if (state.p_run !== undefined) await openPrompt(state.p_run, state.p_step, state.p_group);
});
document.getElementById("reload").addEventListener("click", refresh);
refresh().catch((error) => {
  document.getElementById("errors").replaceChildren(el("div", {}, `viewer: ${error.message}`));
});
