// One call: its summary, its transcript and its timeline (an SVG drawn by the server).
"use strict";

(async () => {
  const { api, el, duration, when, reason, money } = VA;
  const $ = (id) => document.getElementById(id);
  const callId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop() || "");
  let detail;
  try {
    detail = await api("GET", `/api/voice/calls/${encodeURIComponent(callId)}`);
  } catch (e) {
    $("call-title").textContent = "Call not found";
    document.title = "voiceactors — call not found";
    const words = e.status === 404 ? "No call with this id is recorded on this server: the link may be wrong, or " +
      "the record was deleted." : e.message;
    const onward = e.kind === "unauthorized" ? el("a", { href: "/" }, "Sign in on the Talk page.")
      : el("a", { href: "/calls" }, "See the calls that are recorded.");
    $("call-status").replaceChildren(words, " ", onward);
    $("call-status").classList.add("error-text");
    return;
  }
  const c = detail.call;
  $("call-title").textContent = c.started_at ? `Call of ${when(c.started_at)}` : "Call";
  document.title = `voiceactors — ${$("call-title").textContent}`;
  const tokenWords = (s) => {
    const t = s.tokens || {};
    return `${s.total_tokens ?? 0}: text ${t.text_in ?? 0} in / ${t.text_out ?? 0} out, ` +
      `audio ${t.audio_in ?? 0} in / ${t.audio_out ?? 0} out, cached ${t.cached_in ?? 0}`;
  };
  $("call-status").hidden = true;
  const rows = [["started", when(c.started_at)], ["length", duration(c.duration_s)], ["ended", reason(c.ended)],
    ["looked up", c.tool_failures ? `${c.tool_calls} (${c.tool_failures} failed)` : c.tool_calls],
    ["replies", c.responses], ["interruptions", c.barge_ins], ["reconnects", c.reconnects],
    ["tokens", tokenWords(c)], ["cost", money(c.cost_usd) + (c.model ? ` (${c.model})` : "")],
    ["call id", el("span", { class: "id" }, c.call_id)], ["end reason", c.ended || "—"]];
  // the OpenAI-hosted MCP tools the service ran itself (not among our look-ups)
  const hosted = detail.hosted_tools || [];
  if (hosted.length) {
    rows.splice(4, 0, ["hosted tools", hosted.map((h) => `${h.server || "?"} · ${h.tool || "?"} (${h.status || "?"})`)
      .join(", ")]);
  }
  // a continuation and the call it picks up link each other (docs/console.md § Continuing a call)
  const callLink = (id, words) => el("a", { href: `/calls/${encodeURIComponent(id)}`, title: id }, words);
  if (c.continues) rows.splice(3, 0, ["continues", callLink(c.continues, "an earlier call that reached its time limit")]);
  const later = detail.continued_by || [];
  if (later.length) {
    rows.splice(3, 0, ["continued by", el("span", {}, ...later.flatMap((id, n) =>
      [n ? ", " : "", callLink(id, later.length > 1 ? `a later call (${later.length - n})` : "a later call")]))]);
  }
  if ("continued_by" in detail) {     // it ended at its time limit: it can be continued
    $("continue-link").href = `/?continues=${encodeURIComponent(callId)}`;
    $("call-continue").hidden = false;
  }
  $("call-summary").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("call-summary").hidden = false;
  $("call-body").hidden = false;
  const img = $("timeline");
  img.src = `/api/voice/calls/${encodeURIComponent(callId)}/timeline.svg`;
  img.hidden = false;
  const list = $("transcript");
  // the server sends the turns in spoken order (not the order the transcripts arrived)
  for (const line of detail.transcript) {
    const turn = el("li", { class: line.cut_short ? "turn interrupted" : "turn",
                            dataset: { role: line.role || "", itemId: line.item_id || "" } },
      el("span", { class: "who" }, line.role === "user" ? "you" : line.role || "?"),
      el("span", { class: "text" }, line.text));
    if (line.cut_short) turn.append(el("span", { class: "barge" }, "cut off: you spoke over it"));
    list.append(turn);
  }
  $("transcript-empty").hidden = detail.transcript.length > 0;
})();
