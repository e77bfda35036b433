// The gateway's web page: only the public API (/api/v1), the session cookie
// for authentication (the token is exchanged at login and never kept), the
// CSRF token echoed on state changes. Roles, waypoints and upgrade paths are
// the catalog's answers: nothing here computes a rule.

const main = document.getElementById("main");
let me = null;
let csrf = sessionStorage.getItem("vynil-csrf") || "";

const roleRank = { viewer: 1, operator: 2, admin: 3 };
const can = (role) => me && me.role && roleRank[me.role] >= roleRank[role];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    super(`${body.code || status}: ${body.message || "request failed"}${body.request_id ? ` [request ${body.request_id}]` : ""}`);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET") headers["x-csrf-token"] = csrf;
  const response = await fetch(`/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** Reads a server-sent event stream from a fetch response, calling onEvent(name, data). */
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let end;
    while ((end = pending.indexOf("\n\n")) >= 0) {
      const block = pending.slice(0, end);
      pending = pending.slice(end + 2);
      const field = (name) => block.split("\n").find((l) => l.startsWith(name))?.slice(name.length).trim();
      const event = field("event:"), data = field("data:");
      if (event && data) onEvent(event, JSON.parse(data));
    }
  }
}

function show(...nodes) {
  main.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined));
}

function failure(error) {
  return el("p", { class: "error", role: "alert" }, error.message);
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

/** A time in the browser's time zone, its UTC value on hover. */
function when(time) {
  if (!time) return "never";
  const date = new Date(time);
  if (Number.isNaN(date.getTime())) return time;
  return el("time", { datetime: time, title: `${date.toISOString()} (UTC)` }, date.toLocaleString());
}

const withToken = (path, token) => (token ? `${path}${path.includes("?") ? "&" : "?"}page_token=${encodeURIComponent(token)}` : path);

/** Every item of a list, following the API's page tokens (the page size is the gateway's). */
async function everyItem(path) {
  const items = [];
  const asked = new Set();
  let token = "";
  do {
    // Pages that do not advance would be followed forever.
    if (asked.has(token)) throw new Error(`${path}: the page token ${token} came twice; the pages do not advance`);
    asked.add(token);
    const page = await api("GET", withToken(path, token));
    items.push(...page.items);
    token = page.next_page_token || "";
  } while (token);
  return items;
}

/**
 * A table of a list, a page at a time ("Show more" follows the API's page
 * token), or `empty` (what to do) when there is nothing. Resolves with the
 * node and the first page.
 */
async function pagedTable(path, headers, row, empty) {
  const body = el("tbody");
  const more = el("button", { class: "more" }, "Show more");
  const node = el("div", {}, el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), body), more);
  let token = "";
  const load = async () => {
    const page = await api("GET", withToken(path, token));
    body.append(...page.items.map(row));
    token = page.next_page_token || "";
    more.hidden = !token;
    return page;
  };
  more.onclick = () => load().catch((error) => node.append(failure(error)));
  const first = await load();
  return { node: first.items.length ? node : el("p", { class: "empty" }, empty), first };
}

/** Asks the user to type `target` exactly; resolves with what was typed, or null. */
function confirmTyped(text, target) {
  const dialog = document.getElementById("confirm-dialog");
  const input = document.getElementById("confirm-input");
  const ok = document.getElementById("confirm-ok");
  document.getElementById("confirm-text").textContent = `${text} Type ${target} to confirm.`;
  input.value = "";
  ok.disabled = true;
  input.oninput = () => { ok.disabled = input.value !== target; };
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok" ? input.value : null);
    dialog.showModal();
    input.focus();
  });
}

// ---------- login ----------

function loginView() {
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const token = el("input", { type: "password", id: "token", autocomplete: "off", "aria-label": "token" });
  const message = el("p");
  const form = el("form", {
    id: "login",
    onsubmit: async (event) => {
      event.preventDefault();
      try {
        const session = await api("POST", "/session", { token: token.value });
        csrf = session.csrf_token;
        sessionStorage.setItem("vynil-csrf", csrf);
        token.value = "";
        await start();
      } catch (error) {
        message.replaceChildren(failure(error));
      }
    },
  }, el("label", { for: "token" }, "Token "), token, " ", el("button", { type: "submit" }, "Log in"));
  show(el("h1", {}, "Log in"), el("p", {}, "Paste a gateway token (local mode writes one to ~/.local/state/vynil/admin-token)."), form, message);
}

// ---------- JukeBoxes ----------

async function jukeboxesView() {
  const row = (j) => {
    const updated = j.conditions.find((c) => c.type === "Updated");
    const progress = el("span", { class: "scan-progress" });
    const scan = can("operator") ? el("button", {
      class: "scan",
      onclick: async () => {
        try {
          const started = await api("POST", `/jukeboxes/${j.name}/scans`, {});
          progress.textContent = "queued";
          const source = new EventSource(`/api/v1/scans/${started.scan_id}/events`);
          source.addEventListener("progress", (event) => {
            const s = JSON.parse(event.data);
            progress.textContent = `${s.state} ${s.repositories_done}/${s.repositories_total} repositories, ${s.tags_seen} tags`;
            if (["succeeded", "partially_failed", "failed"].includes(s.state)) source.close();
          });
          source.onerror = () => source.close();
        } catch (error) {
          progress.replaceChildren(failure(error));
        }
      },
    }, "Scan now") : null;
    // Writing the index replaces the one at the destination: confirmed by typing the JukeBox's name.
    const exported = can("admin") ? el("button", {
      class: "export",
      onclick: async () => {
        const destination = window.prompt(`Export ${j.name}'s index to (a destination the scanner allows):`);
        if (!destination) return;
        const typed = await confirmTyped(`Replace the index at ${destination} with ${j.name}'s catalog?`, j.name);
        if (typed === null) return;
        try {
          const done = await api("POST", `/jukeboxes/${j.name}/exports`, { destination, confirm: typed });
          progress.textContent = `exported ${done.packages} packages: ${done.written.length} files written, ${done.removed.length} removed`;
        } catch (error) {
          progress.replaceChildren(failure(error));
        }
      },
    }, "Export index…") : null;
    return el("tr", { "data-jukebox": j.name },
      el("td", {}, el("a", { href: `#/catalog/${j.name}` }, j.name)),
      el("td", {}, j.package_count),
      el("td", {}, when(j.last_change_time)),
      el("td", { class: updated?.status === "True" ? "ok" : "error" }, updated ? `${updated.status} ${updated.message}` : "not scanned"),
      el("td", {}, scan, " ", exported, " ", progress));
  };
  const empty = "No JukeBoxes yet: add one (a YAML file in the JukeBox directory in local mode, kubectl apply in a cluster), then scan it.";
  const { node, first } = await pagedTable("/jukeboxes", ["Name", "Packages", "Last change", "Updated", "Scan"], row, empty);
  const skipped = first.skipped.map((s) => el("p", { class: "error" }, `skipped ${s.source}: ${s.problem}`));
  show(el("h1", {}, "JukeBoxes"), node, skipped);
}

// ---------- catalog ----------

async function catalogView(jukebox) {
  const items = await everyItem(`/jukeboxes/${jukebox}/catalog`);
  const groups = new Map();
  for (const p of items) {
    const key = `${p.category}/${p.name}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(p);
  }
  const sections = [...groups].map(([key, revisions]) => {
    const [category, name] = key.split("/");
    const rows = revisions.map((p) => el("tr", { "data-tag": p.tag },
      el("td", {}, p.tag),
      el("td", {}, el("span", { class: `badge type-${p.type}` }, p.type)),
      el("td", {}, p.roles.map((r) => el("span", { class: `badge role-${r.kind}` }, r.description))),
      el("td", {}, when(p.first_seen)),
      el("td", {}, p.signature ? el("span", { class: `badge signature-${p.signature.verdict}`, title: p.signature.reference || "" }, p.signature.description) : "-"),
      el("td", { class: "path" }, (p.digest || "").slice(0, 19)),
      el("td", {}, recallButton(jukebox, p))));
    const from = el("input", { placeholder: "installed version", "aria-label": `installed version of ${key}` });
    const kind = el("select", { "aria-label": `type of ${key}` }, ["tenant", "service", "system"].map((t) => el("option", {}, t)));
    const answer = el("p", { class: "upgrade-path" });
    const ask = el("button", {
      class: "ask-path",
      onclick: async () => {
        try {
          const query = new URLSearchParams({ category, name, type: kind.value });
          if (from.value) query.set("from", from.value);
          const path = await api("GET", `/jukeboxes/${jukebox}/upgrade-path?${query}`);
          if (path.blocked) answer.replaceChildren(el("span", { class: "blocked" }, `blocked (${path.blocked.excluded_by}): ${path.blocked.reason}`));
          else if (!path.steps.length) answer.textContent = "up to date";
          else answer.textContent = [from.value || "fresh install", ...path.steps.map((s) => s.tag)].join(" → ");
        } catch (error) {
          answer.replaceChildren(failure(error));
        }
      },
    }, "Upgrade path");
    return el("section", { class: "package", "data-package": key },
      el("h2", {}, key, " ", el("small", {}, `${revisions[0].registry}/${revisions[0].image}`)),
      table(["Tag", "Type", "Role", "First seen", "Signature", "Digest", ""], rows),
      el("div", {}, from, " ", kind, " ", ask, answer));
  });
  show(el("h1", {}, `Catalog of ${jukebox}`), sections.length ? sections : el("p", {}, "No package yet: scan this JukeBox (JukeBoxes, “Scan now”), or check its source."));
}

// An operator recalls a revision (no instance installs or upgrades to it),
// saying why, or lifts its recall; the catalog is shown again as read back.
function recallButton(jukebox, p) {
  if (!can("operator")) return null;
  const recalled = p.roles.some((r) => r.kind === "recalled");
  const out = el("span", { class: "recall-answer" });
  const button = el("button", {
    class: recalled ? "lift-recall" : "recall",
    onclick: async () => {
      try {
        if (recalled) {
          await api("DELETE", `/jukeboxes/${jukebox}/recalls/${encodeURIComponent(p.tag)}`);
        } else {
          const reason = window.prompt(`Why recall ${p.tag}? (shown with it, and to the instances running it)`);
          if (!reason) return;
          const move_away = window.confirm(`Move the instances running ${p.tag} to the newest selectable revision (older or not)?`);
          await api("POST", `/jukeboxes/${jukebox}/recalls`, { tag: p.tag, reason, move_away });
        }
        // Written and read back in the JukeBox; the catalog follows within moments.
        out.textContent = recalled ? "recall lifted" : "recalled";
        for (let tries = 0; tries < 40; tries++) {
          const now = await everyItem(`/jukeboxes/${jukebox}/catalog`);
          const same = now.find((q) => q.tag === p.tag && q.registry === p.registry && q.image === p.image);
          if (!same || same.roles.some((r) => r.kind === "recalled") !== recalled) break;
          await new Promise((done) => setTimeout(done, 250));
        }
        await catalogView(jukebox);
      } catch (error) {
        out.replaceChildren(failure(error));
      }
    },
  }, recalled ? `Lift recall of ${p.tag}` : `Recall ${p.tag}…`);
  return el("span", {}, button, out);
}

// ---------- purge ----------

function planTable(plan) {
  const rows = plan.entries.map((e) => el("tr", {},
    el("td", {}, e.repository), el("td", {}, e.tag),
    el("td", { class: e.keep ? "keep" : "delete" }, e.keep ? "keep" : "delete"),
    el("td", {}, e.reasons.join("; "))));
  return table(["Repository", "Tag", "Decision", "Reasons"], rows);
}

function reportView(report) {
  const rows = report.outcomes.map((o) => el("tr", {},
    el("td", {}, o.repository), el("td", {}, o.tags.join(", ")), el("td", { class: o.state === "failed" ? "error" : "ok" }, o.state),
    el("td", {}, o.error_message || o.note || "")));
  const count = (state) => report.outcomes.filter((o) => o.state === state).length;
  return el("div", { id: "report" },
    el("h2", {}, "Report"),
    el("p", {}, `${report.target} executed by ${report.executed_by}: ${count("deleted")} deleted (eligible for the registry's garbage collection), ${count("already_gone")} already gone, ${count("failed")} failed`),
    table(["Repository", "Tags", "Outcome", "Detail"], rows));
}

function planView(plan) {
  const summary = el("p", { id: "totals" }, `${plan.target}: ${plan.delete_count} to delete, ${plan.keep_count} to keep (plan ${plan.plan_id})`);
  const warning = plan.usage_unknown ? el("p", { class: "blocked" }, "Installed revisions are unknown: executing acknowledges it.") : null;
  const progress = el("p", { id: "progress" });
  const execute = can("admin") ? el("button", {
    id: "execute",
    onclick: async () => {
      const typed = await confirmTyped(`Delete ${plan.delete_count} tags from ${plan.target}?`, plan.target);
      if (typed === null) return;
      try {
        const response = await fetch(`/api/v1/purge/plans/${plan.plan_id}/execute`, {
          method: "POST",
          headers: { "content-type": "application/json", accept: "text/event-stream", "x-csrf-token": csrf },
          body: JSON.stringify({ confirm: typed, fingerprint: plan.fingerprint, acknowledge_usage_unknown: plan.usage_unknown }),
        });
        if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => ({})));
        let done = 0;
        await readEvents(response, (event, data) => {
          if (event === "outcome") progress.textContent = `${++done} of ${plan.delete_count}: ${data.repository} ${data.tags.join(", ")} ${data.state}`;
          if (event === "report") progress.replaceWith(reportView(data));
          if (event === "error") progress.replaceChildren(failure(new ApiError(500, data)));
        });
      } catch (error) {
        progress.replaceChildren(failure(error));
      }
    },
  }, "Execute…") : null;
  return el("div", { id: "plan" }, summary, warning, execute, progress, planTable(plan));
}

async function purgeView(planId) {
  const area = el("div");
  if (planId) {
    area.replaceChildren(planView(await api("GET", `/purge/plans/${planId}`)));
  }
  const boxes = { items: await everyItem("/jukeboxes") };
  const target = el("select", { id: "target", "aria-label": "JukeBox" }, boxes.items.map((j) => el("option", { value: j.name }, j.name)));
  const make = can("operator") ? el("button", {
    id: "make-plan",
    onclick: async () => {
      try {
        const plan = await api("POST", "/purge/plans", { jukebox: target.value });
        history.replaceState(null, "", `#/purge/${plan.plan_id}`);
        area.replaceChildren(planView(plan));
      } catch (error) {
        area.replaceChildren(failure(error));
      }
    },
  }, "Plan") : el("p", {}, "Making a plan needs the operator role.");
  show(el("h1", {}, "Purge"), el("p", {}, "A plan lists every tag with keep or delete and every reason; nothing is deleted until an admin executes it, typing its target."),
    el("div", {}, target, " ", make), area);
}

// ---------- instances ----------

/** A blocker's reason with its code first, once (most reasons already start with it). */
const coded = (b) => (!b.code || b.reason.startsWith(`[${b.code}]`) ? b.reason : `[${b.code}] ${b.reason}`);

async function instancesView() {
  const detail = el("div", { id: "explanation" });
  const row = (i) => {
    const ref = `${i.ref.kind}/${i.ref.namespace}/${i.ref.name}`;
    const explain = can("operator") ? el("button", { class: "explain", onclick: () => explainInto(detail, ref) }, "Explain") : null;
    return el("tr", { "data-instance": ref },
      el("td", {}, ref), el("td", {}, `${i.category}/${i.package}`), el("td", {}, i.tag || "-"),
      el("td", { class: i.state === "blocked" ? "blocked" : "" }, i.state),
      el("td", {}, i.blocked ? coded(i.blocked) : ""), el("td", {}, explain));
  };
  const empty = "No instances yet: create a TenantInstance, ServiceInstance or SystemInstance naming a JukeBox's package (kubectl apply); each shows here with its state.";
  const { node } = await pagedTable("/instances", ["Instance", "Package", "Tag", "State", "Blocked by", ""], row, empty);
  show(el("h1", {}, "Instances"), node, detail);
}

async function explainInto(detail, ref) {
  try {
    const e = await api("GET", `/instances/${ref}/explain`);
    const blocked = e.blocked ? el("p", { class: "blocked" }, `Blocked by ${e.blocked.criterion}: ${coded(e.blocked)}`) : null;
    const tags = [["installed", e.from_tag], ["next", e.to_tag], ["latest", e.latest_tag]].filter(([, t]) => t).map(([w, t]) => `${w} ${t}`).join(", ");
    const allow = can("admin") && e.children_to_delete.length ? el("button", {
      id: "allow-delete",
      onclick: async () => {
        const typed = await confirmTyped(`Delete ${e.children_to_delete.length} recorded children of ${ref} without package hooks?`, ref);
        if (typed === null) return;
        try {
          await api("POST", `/instances/${ref}/allow-delete-without-package`, { confirm: typed, fingerprint: e.children_fingerprint, reason: "from the web page" });
          detail.append(el("p", { class: "ok" }, "Allowed: lifecycle starts the reaper."));
        } catch (error) {
          detail.append(failure(error));
        }
      },
    }, "Allow delete without package…") : null;
    // Each fact once: a blocked instance's reason is said by the red line
    // (with its code), not again by the summary, the steps or a quarantine.
    const said = (text) => e.blocked && text.includes(e.blocked.reason);
    const approve = can("operator") && e.approval_fingerprint ? el("button", {
      id: "approve-upgrade",
      onclick: async () => {
        try {
          const done = await api("POST", `/instances/${ref}/approve-upgrade`, { fingerprint: e.approval_fingerprint, reason: "from the web page" });
          detail.append(el("p", { class: "ok" }, `Approved: ${done.from_tag} → ${done.to_tag}.`));
        } catch (error) {
          detail.append(failure(error));
        }
      },
    }, `Approve upgrade ${e.from_tag || ""} → ${e.to_tag}`) : null;
    const quarantines = e.quarantined.map((q) => quarantineLine(detail, ref, q, e.blocked && e.blocked.reason.includes(q.reason)));
    const summary = e.blocked ? e.state : `${e.state}: ${e.summary}`;
    const steps = e.details.filter((d) => !said(d));
    const parts = [el("h2", {}, ref), el("p", {}, summary), blocked,
      steps.length ? el("ol", { class: "steps" }, steps.map((d) => el("li", {}, d))) : null, tags ? el("p", {}, tags) : null,
      approve, ...quarantines,
      e.children_to_delete.length ? el("p", {}, `A delete without package would delete: ${e.children_to_delete.join("; ")}`) : null, allow];
    // replaceChildren writes a null as the text "null".
    detail.replaceChildren(...parts.filter((part) => part !== null && part !== undefined));
  } catch (error) {
    detail.replaceChildren(failure(error));
  }
}

// A revision quarantined for the instance after an upgrade to it failed,
// with an operator's two ways out while the failure awaits them.
function quarantineLine(detail, ref, q, reasonSaid) {
  const states = {
    automatic: "rolled back on its own (the failed run applied nothing)",
    awaiting_operator: `awaiting an operator: ${q.rollback_detail || ""}`,
    approved: q.rollback_detail || "rollback approved",
  };
  const decide = (route, label, done) => el("button", {
    class: route,
    onclick: async () => {
      try {
        await api("POST", `/instances/${ref}/${route}`, { tag: q.tag, reason: "from the web page" });
        detail.append(el("p", { class: "ok" }, done));
      } catch (error) {
        detail.append(failure(error));
      }
    },
  }, label);
  const operator = can("operator");
  const rollback = operator && q.rollback === "awaiting_operator"
    ? decide("rollback", `Roll back to ${q.from_tag}`, `Rolling back to ${q.from_tag}.`) : null;
  const clear = operator ? decide("clear-quarantine", `Clear quarantine of ${q.tag}`, `${q.tag} is no longer quarantined.`) : null;
  const line = el("p", { class: "quarantine", "data-tag": q.tag }, `Quarantined ${q.tag} (from ${q.from_tag}, `, when(q.at),
    `)${reasonSaid ? "" : `: ${q.reason}`}; ${states[q.rollback] || q.rollback}. `);
  for (const button of [rollback, clear]) if (button) line.append(button, " ");
  return line;
}

// ---------- routing ----------

async function route() {
  if (!me) return loginView();
  const [, view, arg] = (location.hash || "#/jukeboxes").split("/");
  try {
    if (view === "catalog" && arg) await catalogView(arg);
    else if (view === "purge") await purgeView(arg);
    else if (view === "instances") await instancesView();
    else await jukeboxesView();
  } catch (error) {
    if (error.status === 401) { me = null; return loginView(); }
    show(failure(error));
  }
}

async function start() {
  try {
    me = await api("GET", "/whoami");
    if (me.csrf_token) { csrf = me.csrf_token; sessionStorage.setItem("vynil-csrf", csrf); }
  } catch {
    me = null;
  }
  if (me) {
    document.getElementById("nav").hidden = false;
    document.getElementById("logout").hidden = false;
    document.getElementById("who").textContent = `${me.name} (${me.role || "Kubernetes RBAC"})`;
  }
  await route();
}

document.getElementById("logout").addEventListener("click", async () => {
  await api("DELETE", "/session").catch(() => {});
  sessionStorage.removeItem("vynil-csrf");
  me = null;
  loginView();
});
window.addEventListener("hashchange", route);
start();
