// Call history: the recent calls from the server's call records.
"use strict";

(async () => {
  const { api, el, duration, when, reason, money } = VA;
  const status = document.getElementById("calls-status");
  const table = document.getElementById("calls");
  let calls;
  try {
    ({ calls } = await api("GET", "/api/voice/calls"));
  } catch (e) {
    status.replaceChildren(e.message, " ", e.kind === "unauthorized" ? el("a", { href: "/" }, "Sign in on the console.") : "");
    status.classList.add("error-text");
    return;
  }
  if (!calls.length) {
    status.textContent = "No calls recorded yet. Start one from the console.";
    return;
  }
  status.textContent = `${calls.length} most recent call${calls.length === 1 ? "" : "s"}, newest first.`;
  const body = table.querySelector("tbody");
  for (const c of calls) {
    body.append(el("tr", { dataset: { callId: c.call_id, ended: c.ended || "" } },
      el("td", {}, when(c.started_at)),
      el("td", {}, el("a", { href: `/calls/${encodeURIComponent(c.call_id)}` }, c.call_id)),
      el("td", { class: "num" }, duration(c.duration_s)),
      el("td", {}, c.unreadable ? "record unreadable" : reason(c.ended)),
      el("td", { class: "num" }, c.tool_failures ? `${c.tool_calls} (${c.tool_failures} failed)` : c.tool_calls),
      el("td", { class: "num" }, c.barge_ins),
      el("td", { class: "num" }, c.reconnects),
      el("td", { class: "num" }, c.total_tokens ?? 0),
      el("td", { class: "num" }, money(c.cost_usd))));
  }
  table.hidden = false;
})();
