// Call history: the recent calls from the server's call records, each named
// by when it was and what was said first (the call id stays in its page).
"use strict";

(async () => {
  const { api, el, duration, when, reason, money } = VA;
  const status = document.getElementById("calls-status");
  const table = document.getElementById("calls");
  let calls;
  try {
    ({ calls } = await api("GET", "/api/voice/calls"));
  } catch (e) {
    status.replaceChildren(e.message, " ", e.kind === "unauthorized" ? el("a", { href: "/" }, "Sign in on the Talk page.") : "");
    status.classList.add("error-text");
    return;
  }
  if (!calls.length) {
    status.replaceChildren("No calls recorded on this server yet. ", el("a", { href: "/" }, "Start one on the Talk page."));
    return;
  }
  status.textContent = `${calls.length} most recent call${calls.length === 1 ? "" : "s"}, newest first. ` +
    "Open one for its transcript and timeline.";
  const body = table.querySelector("tbody");
  for (const c of calls) {
    const href = `/calls/${encodeURIComponent(c.call_id)}`;
    const said = c.unreadable ? el("span", { class: "quiet" }, "record unreadable")
      : c.first_words ? el("span", { class: "said" }, `“${c.first_words}”`)
      : el("span", { class: "quiet" }, "nothing transcribed");
    const tools = c.tool_failures ? `${c.tool_calls} (${c.tool_failures} failed)` : `${c.tool_calls}`;
    body.append(el("tr", { dataset: { callId: c.call_id, ended: c.ended || "" } },
      el("td", { class: "when" }, el("a", { href, title: c.call_id }, when(c.started_at))),
      el("td", {}, said),
      el("td", { class: "num", dataset: { label: "length" } }, duration(c.duration_s)),
      el("td", { dataset: { label: "ended" } }, c.unreadable ? "—" : reason(c.ended)),
      el("td", { class: "num", dataset: { label: "looked up" } }, tools),
      el("td", { class: "num", dataset: { label: "cost" } }, money(c.cost_usd))));
  }
  table.hidden = false;
})();
