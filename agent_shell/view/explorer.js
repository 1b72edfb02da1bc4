// The decision explorer (cb-agent view): renders the data embedded in this page, lazily.
// The index block is parsed at load; an episode's block only when it is opened, a decision's
// candidate table only when it is unfolded, and the episode list 100 rows at a time.
"use strict";
(function () {
  const INDEX = JSON.parse(document.getElementById("index").textContent);
  const EPISODES = INDEX.episodes;
  const PAGE = 100;
  const details = new Map();

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  function detail(i) {
    if (!details.has(i)) details.set(i, JSON.parse(document.getElementById("ep-" + i).textContent));
    return details.get(i);
  }

  const fmt = (x) => (x === null || x === undefined ? "-" : Number(x).toFixed(3));
  const argmax = (xs) => xs.reduce((best, x, i) => (x > xs[best] ? i : best), 0);

  // -- one scored decision: candidates ranked by log P, bars for the prior and concept terms ------
  function termBar(value, scale) {
    const w = scale > 0 ? (50 * Math.min(Math.abs(value), scale)) / scale : 0;
    const fill = h("span", { class: "fill " + (value < 0 ? "neg" : "pos") });
    fill.style.left = (value < 0 ? 50 - w : 50) + "%";
    fill.style.width = w + "%";
    return h("span", { class: "bar" }, h("span", { class: "zero" }), fill);
  }

  // cands: strings; prior, concept (or null: alpha = 0), logp: numbers; chosen, expert: index or null
  function candidateTable(cands, prior, concept, logp, chosen, expert) {
    const order = cands.map((_, i) => i).sort((a, b) => logp[b] - logp[a] || a - b);
    const priorPick = argmax(prior);
    const values = prior.concat(concept || []).map(Math.abs);
    const scale = Math.max(...values, 1e-9);
    const rows = order.map((i, rank) => {
      const marks = [];
      if (i === chosen) marks.push(h("span", { class: "mark chosen" }, "chosen"));
      if (i === expert) marks.push(h("span", { class: "mark expert" }, "expert"));
      if (i === priorPick && priorPick !== chosen) marks.push(h("span", { class: "mark prior" }, "prior's pick"));
      const c = concept ? concept[i] : 0;
      return h("tr", { class: [i === chosen ? "is-chosen" : "", i === expert ? "is-expert" : ""].join(" ").trim() || null,
                       "data-index": i },
        h("td", { class: "num" }, rank + 1),
        h("td", { class: "cand" }, cands[i], " ", marks),
        h("td", { class: "term prior", "data-value": prior[i] }, termBar(prior[i], scale), h("span", { class: "v" }, fmt(prior[i]))),
        h("td", { class: "term concept", "data-value": concept ? concept[i] : "" }, termBar(c, scale),
          h("span", { class: "v" }, concept ? fmt(c) : "0")),
        h("td", { class: "num logp", "data-value": logp[i] }, fmt(logp[i])),
        h("td", { class: "num" }, (100 * Math.exp(logp[i])).toFixed(1) + "%"));
    });
    return h("table", { class: "cands" },
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "candidate"),
        h("th", { title: "log Qbar(a|x): length-normalised LM log-probability, normalised over the set" }, "prior term"),
        h("th", { title: "alpha . phi(x, a): the concept's score" }, concept ? "concept term" : "concept term (alpha = 0)"),
        h("th", { title: "log P(a|x) = log-softmax of prior + concept" }, "log P"), h("th", {}, "P"))),
      h("tbody", {}, rows));
  }

  // -- an episode's steps ---------------------------------------------------------------------------
  function stepRows(ep, trial, firstDiff) {
    const S = ep.strings;
    return trial.steps.map((s, i) => {
      const d = s.d;
      const action = S[s.a];
      const row = h("div", { class: "step " + s.k + (i === firstDiff ? " first-diff" : ""), "data-step": i });
      row.append(h("div", { class: "idx" }, i + 1),
        h("div", { class: "body" },
          h("div", { class: "action" }, s.k === "think" ? action : "> " + action),
          d && d.reply !== undefined && s.k === "env" ? h("div", { class: "reply" }, "reply: " + JSON.stringify(d.reply)) : null,
          s.e !== undefined ? h("div", { class: "expert-note" + (S[s.e] === action ? " same" : "") }, "expert: " + S[s.e]
            + (d && d.expert === -1 ? " (not among the scored candidates)" : "")) : null,
          h("div", { class: "obs" }, S[s.o])));
      if (d && d.candidates) {
        const holder = h("div", { class: "decision" });
        const button = h("button", { class: "unfold", "data-step": i, onclick: () => {
          if (holder.firstChild) { holder.replaceChildren(); button.classList.remove("open"); return; }
          holder.append(candidateTable(d.candidates.map((k) => S[k]), d.prior, d.concept, d.log_p, d.chosen,
            d.expert === undefined || d.expert < 0 ? null : d.expert));
          button.classList.add("open");
        } }, `${d.candidates.length} candidates, P(chosen) = ${(100 * d.p_chosen).toFixed(1)}%`);
        row.querySelector(".body").append(button, holder);
      } else if (d && d.n_candidates) {
        row.querySelector(".body").append(h("div", { class: "reply" }, `${d.n_candidates} candidates (terms not recorded)`));
      }
      return row;
    });
  }

  function episodeColumn(i, firstDiff) {
    const meta = EPISODES[i];
    const ep = detail(i);
    const col = h("div", { class: "episode", "data-episode": i },
      h("h3", {}, `${meta.agent}: ${meta.outcome}`, " ", h("span", { class: "muted" }, `${meta.steps} steps`)),
      h("div", { class: "muted" }, meta.task_id),
      h("div", { class: "instruction" }, ep.strings[ep.instruction]),
      h("div", { class: "obs first" }, ep.strings[ep.observation]));
    if (ep.error) col.append(h("div", { class: "note" }, `engine fault: ${ep.error.type}: ${ep.error.message}`));
    ep.trials.forEach((t, k) => {
      col.append(h("h4", {}, `trial ${k + 1}: ${t.won ? "won" : "lost"}`));
      if (t.memory.length) col.append(h("div", { class: "memory" }, "reflections: " + t.memory.join(" | ")));
      col.append(...stepRows(ep, t, k === 0 ? firstDiff : -1));
      if (t.reflection) col.append(h("div", { class: "memory" }, "reflection: " + t.reflection));
    });
    return col;
  }

  function firstDifference(a, b) {
    const x = detail(a), y = detail(b);
    const sa = x.trials.length ? x.trials[0].steps.map((s) => x.strings[s.a]) : [];
    const sb = y.trials.length ? y.trials[0].steps.map((s) => y.strings[s.a]) : [];
    for (let i = 0; i < Math.max(sa.length, sb.length); i++) if (sa[i] !== sb[i]) return i;
    return -1;
  }

  function openEpisode(i, other) {
    const view = document.getElementById("view");
    const meta = EPISODES[i];
    const peers = EPISODES.map((e, k) => [e, k]).filter(([e, k]) => k !== i && e.task_id === meta.task_id);
    const select = h("select", { id: "compare", onchange: (ev) => openEpisode(i, ev.target.value === "" ? null : +ev.target.value) },
      h("option", { value: "" }, "side by side with..."),
      peers.map(([e, k]) => h("option", { value: k, selected: k === other }, `${e.agent} (${e.outcome})`)));
    const cols = h("div", { class: other === null || other === undefined ? "cols one" : "cols two" });
    let note = null;
    if (other !== null && other !== undefined) {
      const diff = firstDifference(i, other);
      note = h("div", { class: "note", id: "diff-note" }, diff < 0 ? "the two first trials take the same steps"
        : `first trial: the first step where they differ is step ${diff + 1} (highlighted)`);
      cols.append(episodeColumn(i, diff), episodeColumn(other, diff));
    } else {
      cols.append(episodeColumn(i, -1));
    }
    view.replaceChildren(h("div", { class: "toolbar" }, h("button", { onclick: () => { view.replaceChildren(); location.hash = ""; } }, "close"),
      peers.length ? select : h("span", { class: "muted" }, "no other agent played this game")), ...(note ? [note] : []), cols);
    history.replaceState(null, "", "#ep=" + i + (other !== null && other !== undefined ? "&with=" + other : ""));
    view.scrollIntoView();
  }

  // -- the episode list and its filters -------------------------------------------------------------
  function episodeList() {
    const uniq = (key) => [...new Set(EPISODES.map((e) => e[key]))].sort();
    const f = { agent: "", task_type: "", outcome: "", q: "" };
    let shown = PAGE;
    const sel = (key, label, values) => h("select", { id: "filter-" + key, onchange: (ev) => { f[key] = ev.target.value; shown = PAGE; draw(); } },
      h("option", { value: "" }, label), values.map((v) => h("option", { value: v }, v)));
    const search = h("input", { id: "filter-game", type: "search", placeholder: "game id contains...",
      oninput: (ev) => { f.q = ev.target.value.toLowerCase(); shown = PAGE; draw(); } });
    const count = h("span", { class: "muted", id: "episode-count" });
    const body = h("tbody", {});
    const more = h("button", { onclick: () => { shown += PAGE; draw(); } }, "show more");
    function draw() {
      const rows = EPISODES.map((e, i) => [e, i]).filter(([e]) => (!f.agent || e.agent === f.agent)
        && (!f.task_type || e.task_type === f.task_type) && (!f.outcome || e.outcome === f.outcome)
        && (!f.q || e.task_id.toLowerCase().includes(f.q)));
      count.textContent = `${rows.length} of ${EPISODES.length} episodes`;
      body.replaceChildren(...rows.slice(0, shown).map(([e, i]) => h("tr", { class: "episode-row " + e.outcome, "data-episode": i, "data-scored": e.scored,
        onclick: () => openEpisode(i, null) }, h("td", {}, e.agent), h("td", {}, e.task_type), h("td", { class: "game" }, e.task_id),
        h("td", {}, e.outcome), h("td", { class: "num" }, e.steps), h("td", { class: "num" }, e.scored))));
      more.style.display = rows.length > shown ? "" : "none";
    }
    draw();
    return h("section", { id: "episodes" }, h("h2", {}, "Episodes"),
      h("div", { class: "filters" }, sel("agent", "every agent", uniq("agent")), sel("task_type", "every task type", uniq("task_type")),
        sel("outcome", "won or lost", ["won", "lost", "error"]), search, count),
      h("table", { class: "list" }, h("thead", {}, h("tr", {}, ["agent", "task type", "game", "outcome", "steps", "scored decisions"].map((c) => h("th", {}, c)))), body),
      more, h("div", { id: "view" }));
  }

  // -- held-out expert decisions (eval-decisions --out) --------------------------------------------
  function heldoutSection() {
    let data = null;
    const body = h("div", { id: "heldout-list" });
    const f = { task_type: "", show: "" };
    const types = h("select", { id: "heldout-type", onchange: (ev) => { f.task_type = ev.target.value; draw(); } }, h("option", { value: "" }, "every task type"));
    const show = h("select", { id: "heldout-show", onchange: (ev) => { f.show = ev.target.value; draw(); } },
      h("option", { value: "" }, "every decision"), h("option", { value: "overturned" }, "the concept overturns the prior"),
      h("option", { value: "fixed" }, "... and gets it right"), h("option", { value: "wrong" }, "the concept is wrong"));
    const count = h("span", { class: "muted" });
    function load() {
      if (data) return;
      data = JSON.parse(document.getElementById("heldout").textContent).map((d) => {
        const pick = argmax(d.log_p), prior = argmax(d.prior);
        return Object.assign(d, { pick, priorPick: prior, overturned: pick !== prior });
      });
      [...new Set(data.map((d) => d.task_type))].sort().forEach((t) => types.append(h("option", { value: t }, t)));
    }
    function draw() {
      load();
      const rows = data.filter((d) => (!f.task_type || d.task_type === f.task_type)
        && (!f.show || (f.show === "overturned" ? d.overturned : f.show === "fixed" ? d.overturned && d.pick === d.expert : d.pick !== d.expert)));
      count.textContent = `${rows.length} of ${data.length} decisions`;
      body.replaceChildren(...rows.slice(0, 200).map((d) => {
        const holder = h("div", { class: "decision" });
        const row = h("div", { class: "heldout " + (d.pick === d.expert ? "right" : "wrong") + (d.overturned ? " overturned" : "") },
          h("button", { class: "unfold", onclick: () => { if (holder.firstChild) holder.replaceChildren();
            else holder.append(h("div", { class: "obs" }, d.observation), candidateTable(d.candidates, d.prior, d.concept, d.log_p, d.pick, d.expert)); } },
            `${d.task_type} ${d.task_id} step ${d.step + 1}`),
          h("span", {}, ` expert: ${d.candidates[d.expert]}; prior: ${d.candidates[d.priorPick]}; concept: ${d.candidates[d.pick]}`),
          d.overturned ? h("span", { class: "mark prior" }, "overturned") : null, holder);
        return row;
      }));
    }
    const section = h("section", { id: "heldout-section" }, h("h2", {}, `Held-out expert decisions (${INDEX.heldout})`),
      h("p", { class: "muted" }, "teacher forcing on expert trajectories (eval-decisions): the chosen candidate is the argmax of log P under the type's concept"),
      INDEX.accuracy.length ? h("table", { class: "success" }, h("thead", {}, h("tr", {},
        ["model", "task type", "decisions", "alpha = 0", "concept"].map((c) => h("th", {}, c)))),
        h("tbody", {}, INDEX.accuracy.map((r) => h("tr", { class: r[1] === "all" ? "all" : null }, r.map((c) => h("td", {}, c)))))) : null,
      h("div", { class: "filters" }, types, show, count), body);
    draw();
    return section;
  }

  // -- the page --------------------------------------------------------------------------------------
  function summarySection() {
    const s = INDEX.summary;
    const out = h("section", { id: "summary" }, h("h1", {}, s.title || "cb-agent decisions"),
      h("div", { class: "muted" }, "from " + INDEX.sources.join(", ")));
    if (INDEX.notes.length) out.append(h("ul", { class: "notes" }, INDEX.notes.map((n) => h("li", {}, "warning: " + n))));
    if (s.differing.length) out.append(h("div", { class: "note" }, `settings differ between the episodes (${s.differing.join(", ")}): one row per setting`));
    if (s.table) {
      out.append(h("table", { class: "success" }, h("thead", {}, h("tr", {}, s.table.head.map((c) => h("th", {}, c)))),
        h("tbody", {}, s.table.rows.map((r) => h("tr", { class: r[1] === "all" ? "all" : null }, r.map((c) => h("td", {}, c)))))));
      const chart = h("div", { class: "chart" });
      chart.innerHTML = s.chart;  // SVG written by matplotlib for this page
      out.append(chart);
      const labels = Object.keys(s.settings);
      const keys = labels.length ? Object.keys(s.settings[labels[0]]) : [];
      out.append(h("details", {}, h("summary", {}, "run settings"), h("table", { class: "settings" },
        h("thead", {}, h("tr", {}, h("th", {}, "setting"), labels.map((l) => h("th", {}, l)))),
        h("tbody", {}, keys.map((k) => h("tr", {}, h("td", {}, k), labels.map((l) => h("td", {}, s.settings[l][k]))))))));
    }
    return out;
  }

  const app = document.getElementById("app");
  app.replaceChildren(summarySection());
  if (EPISODES.length) app.append(episodeList());
  if (INDEX.heldout) app.append(heldoutSection());
  const m = /#ep=(\d+)(?:&with=(\d+))?/.exec(location.hash);
  if (m && +m[1] < EPISODES.length) openEpisode(+m[1], m[2] === undefined ? null : +m[2]);
  document.body.setAttribute("data-ready", String(performance.now()));  // ms since the page began loading
})();
