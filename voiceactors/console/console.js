// The voice console: one call from Start to Hang up.
//
// Realtime: mint (/api/voice/session) → microphone → RTCPeerConnection +
// "oai-events" data channel → offer to {realtime base}/realtime/calls → call
// id from Location → answer → once the channel is open, /api/voice/connect →
// follow /api/voice/events. Live (docs/live.md): microphone →
// RTCPeerConnection → offer to /api/voice/live (the server creates the
// session and attaches to it: no key reaches this page) → answer and session
// id → follow /api/voice/events. The call ends on Hang up, the channel's
// close, or the feed's call.ended — whichever comes first.
"use strict";

(() => {
  const { api, ApiFailure, el, reason, money, toolWords } = VA;
  const $ = (id) => document.getElementById(id);
  const CHANNEL_OPEN_TIMEOUT_MS = 15000;
  const FEED_END_GRACE_MS = 1500;

  let config = null;
  let call = null;          // the live call's resources, or null
  let capped = null;        // the id of the last call, when it ended at its time limit (Continue picks it up)

  // --- state and errors -------------------------------------------------------

  // What the state line says (the state's name stays in data-state for styles and tests).
  const STATE_WORDS = { idle: "ready", connecting: "connecting…", live: "live — talk now", ended: "call ended" };

  function setState(name, detail, words) {
    $("state").dataset.state = name;
    $("state-dot").dataset.state = name;
    $("state").textContent = words || STATE_WORDS[name] || name;
    $("state-detail").textContent = detail ? `· ${detail}` : "";
    const busy = name === "connecting" || name === "live";
    $("continue").hidden = busy || !capped;
    // the button that has focus is about to be hidden: hand focus to the one
    // that takes its place, so a keyboard user is not dropped to the page
    const focused = document.activeElement;
    const moveFocus = focused === $("start") || focused === $("hangup") || focused === $("retry")
      || focused === $("continue") || focused === document.body || focused === null;
    $("start").hidden = busy;
    $("hangup").hidden = !busy;
    if (moveFocus && !$("call-panel").hidden) (busy ? $("hangup") : capped ? $("continue") : $("start")).focus();
    document.body.dataset.callState = name;
  }

  // ``link``: {href, words} for a way on when a retry cannot help (Retry is then hidden).
  function showError(words, kind, link) {
    $("error-text").textContent = words;
    $("error").dataset.kind = kind || "error";
    $("error-link").hidden = !link;
    $("retry").hidden = Boolean(link);
    if (link) {
      $("error-link").href = link.href;
      $("error-link").textContent = link.words;
    }
    $("error").hidden = false;
    (link ? $("error-link") : $("retry")).focus();
  }

  function clearError() {
    $("error").hidden = true;
    $("error-text").textContent = "";
    delete $("error").dataset.kind;
  }

  // A refused link (``/?day=2026-13-01``) cannot start however often it is retried.
  function linkError(e, linked) {
    if (!(e instanceof ApiFailure) || e.status !== 400 || !String(e.error || "").startsWith("context")) return null;
    const what = { day: "a day (YYYY-MM-DD)", entity: "a person or thing", commitment: "a commitment",
                   facet: "a journal area" }[linked.kind] || "an item";
    return `This page's address asks for a call about ${what}, but “${linked.id}” is not one the server can ` +
      "look for. Correct the address, or open the console without it.";
  }

  // A refused continuation (``/?continues=<id>`` of a call that did not end at its limit) cannot start either.
  function continuesError(e, continues) {
    if (!(e instanceof ApiFailure) || e.status !== 400 || !String(e.error || "").startsWith("continues")) return null;
    return `This page's address asks to continue the call “${continues}”, but the server cannot: ${e.error}. ` +
      "Only a call that ended at its time limit can be continued. Open the console without it.";
  }

  // --- before Start: what the server told us to say -----------------------------------

  const NOTICES = {
    no_openai_key: "No OpenAI key is configured on this server, so Start will be refused. Put " +
      "voice.openai_api_key in the journal's config/journal.json (read again at the next Start, no restart " +
      "needed), or restart the server with OPENAI_API_KEY set.",
    journal_empty: "The journal folder has no days in it, so the assistant will find nothing to talk about. " +
      "Check the folder the server was started with (--journal).",
  };

  function showNotices(kinds) {
    const known = (kinds || []).filter((kind) => NOTICES[kind]);
    $("notices").replaceChildren(...known.map((kind) => el("li", { dataset: { notice: kind } }, NOTICES[kind])));
    $("notices").hidden = known.length === 0;
  }

  class CallFailure extends Error {
    constructor(kind, words) { super(words); this.kind = kind; }
  }

  // --- linked context (docs/console.md § Opening with a context) -------------------

  // The page's URL may name what the call is about: /?entity=romeo_montague,
  // /?day=2026-03-04, /?commitment=<id>, /?facet=work (the first of these).
  const CONTEXT_KINDS = ["entity", "day", "commitment", "facet"];

  function linkedContext() {
    const params = new URLSearchParams(window.location.search);
    for (const kind of CONTEXT_KINDS) {
      const id = params.get(kind);
      if (id) return { kind, id };
    }
    return null;
  }

  // --- continuing a call (docs/console.md § Continuing a call) -----------------------

  // A call that ended at its time limit (ours, or the voice service's own) can be continued.
  const CONTINUABLE = new Set(["max_duration", "session_expired"]);

  // The page's URL may name a call to continue: /?continues=<call id> (the call page's Continue link).
  function continuesParam() {
    return new URLSearchParams(window.location.search).get("continues") || null;
  }

  // The call this one continues, as the server accepted it: a link to its page.
  function showContinues(callId) {
    const node = $("continues");
    node.hidden = !callId;
    if (!callId) return node.replaceChildren();
    node.replaceChildren("picking up ", el("a", { href: `/calls/${encodeURIComponent(callId)}` }, "the earlier call"),
      " where it stopped");
  }

  // What the server verified (never what the URL said): the current
  // selection, and the original link when the selection moved away from it.
  function showAbout(selection, link) {
    const node = $("about");
    node.hidden = !selection && !link;
    if (node.hidden) return;
    const name = (ref) => (ref && ref.verified ? ref.name : null);
    let words = name(selection) ? `about: ${name(selection)}` : "the linked item could not be found";
    if (link && name(link) && selection && name(selection) && link.id !== selection.id) {
      words += ` (opened from ${name(link)})`;
    }
    node.textContent = words;
  }

  // The agent in charge of the call (docs/agents.md): its name, as the feed says it.
  function showAgent(agent) {
    const node = $("agent");
    node.hidden = !agent;
    node.textContent = agent ? `speaking: ${agent}` : "";
  }

  // --- conversation (spoken order, by item) -------------------------------------

  function itemNode(itemId, role, previousId) {
    const list = $("conversation");
    let node = itemId ? list.querySelector(`li[data-item-id="${CSS.escape(itemId)}"]`) : null;
    if (!node) {
      node = el("li", { class: "turn", dataset: { itemId: itemId || "", role: role || "" } },
        el("span", { class: "who" }), el("span", { class: "text" }));
      node.hidden = true;       // shown once it has words
      const previous = previousId ? list.querySelector(`li[data-item-id="${CSS.escape(previousId)}"]`) : null;
      if (previous) previous.after(node); else list.append(node);
    }
    if (role && !node.dataset.role) node.dataset.role = role;
    return node;
  }

  function setWords(itemId, role, text, { append = false, final = false } = {}) {
    if (role !== "user" && role !== "assistant") return;
    const node = itemNode(itemId, role);
    node.dataset.role = role;
    node.querySelector(".who").textContent = role === "user" ? (config && config.demo ? "you (scripted)" : "you") : "assistant";
    const span = node.querySelector(".text");
    if (final || !node.dataset.final) span.textContent = append ? span.textContent + text : text;
    if (final) node.dataset.final = "1";
    // a turn still streaming in is busy: a screen reader reads it once, whole,
    // instead of word by word (the conversation is a polite live region)
    if (node.dataset.final) node.removeAttribute("aria-busy"); else node.setAttribute("aria-busy", "true");
    node.hidden = !span.textContent;
  }

  function markInterrupted(itemIds) {
    for (const itemId of itemIds) {
      const node = $("conversation").querySelector(`li[data-item-id="${CSS.escape(itemId)}"]`);
      if (node && !node.querySelector(".barge")) {
        node.classList.add("interrupted");
        node.removeAttribute("aria-busy");
        node.append(el("span", { class: "barge" }, "cut off: you spoke over it"));
      }
    }
  }

  // --- the tool feed ---------------------------------------------------------------

  function toolNode(event) {
    const list = $("tools");
    let node = list.querySelector(`li[data-tool-call-id="${CSS.escape(event.tool_call_id)}"]`);
    if (!node) {
      // the protocol's words (tool name, epoch) only in the row's tooltip
      node = el("li", { class: "tool", title: `${event.tool} · epoch ${event.epoch}`,
                        dataset: { toolCallId: event.tool_call_id, status: "running", tool: event.tool } },
        el("span", { class: "tool-name" }, toolWords(event.tool)),
        el("span", { class: "tool-status" }, "working…"));
      list.append(node);
    }
    return node;
  }

  function onFeedEvent(event) {
    switch (event.type) {
      case "tool.started":
        toolNode(event);
        break;
      case "tool.progress": {
        // the source's own report while it works: how far, and its words (as text)
        const node = toolNode(event);
        if (node.dataset.status !== "running") break;
        const total = Number(event.total);
        const part = total > 0 ? `${Math.round((100 * Number(event.progress)) / total)} %` : "";
        const words = [part, event.message || ""].filter(Boolean).join(" · ");
        node.querySelector(".tool-status").textContent = words ? `working… ${words}` : "working…";
        break;
      }
      case "tool.finished":
      case "tool.failed": {
        const node = toolNode(event);
        const ok = event.type === "tool.finished";
        node.dataset.status = ok ? "finished" : "failed";
        node.querySelector(".tool-status").textContent =
          `${ok ? "✓ done" : `✗ ${OUTCOME_WORDS[event.outcome] || "failed"}`} · ${took(event.duration_ms)}`;
        break;
      }
      case "nav.hint":
        suggest(event);
        break;
      case "observer.action":
        $("observer").append(el("li", { title: JSON.stringify(event.action) }, observerWords(event.action)));
        $("observer-box").hidden = false;
        break;
      case "transcript":
        // the data channel usually got there first; this fills what it missed
        setWords(event.item_id, event.role, event.text, { final: !itemHasWords(event.item_id) });
        break;
      case "selection":
        showAbout(event.selection, event.link);
        break;
      case "agent":
        showAgent(event.agent);
        break;
      case "usage": {
        // after each response: the call's tokens and cost so far
        const total = Object.values(event.call.tokens || {}).reduce((a, b) => a + b, 0);
        $("call-usage").textContent = `· ${total} tokens · ${money(event.call.cost_usd)}`;
        $("call-usage").hidden = false;
        break;
      }
      case "call.ended":
        endCall(`ended: ${reason(event.reason)}`, event.reason);
        break;
    }
  }

  const OUTCOME_WORDS = { timeout: "took too long", error: "failed", invalid: "asked wrongly",
                          busy: "journal busy", rejected: "refused", unavailable: "unavailable" };

  function took(ms) {
    const n = Number(ms);
    return n >= 1000 ? `${(n / 1000).toFixed(1)} s` : `${Math.max(1, Math.round(n))} ms`;
  }

  // A nav hint names a place in the journal's own app (docs/tools.md): one
  // this console can open is offered as a new call about it; the rest
  // ("today", a search) name no place here and are left out.
  function suggestion(target) {
    const [kind, ...rest] = String(target).split("/");
    const id = rest.join("/");
    if (kind === "entity" && id) return { href: `/?entity=${encodeURIComponent(id)}`, words: id.replace(/_/g, " ") };
    if (kind === "today" && rest[0] === "journal" && rest[1])
      return { href: `/?day=${encodeURIComponent(rest[1])}`, words: `the day ${rest[1]}` };
    if (kind === "commitment" && id) return { href: `/?commitment=${encodeURIComponent(id)}`, words: "this commitment" };
    if (kind === "facet" && id) return { href: `/?facet=${encodeURIComponent(id)}`, words: `your ${id} area` };
    return null;
  }

  function suggest(event) {
    const found = suggestion(event.target);
    if (!found || $("nav-hints").querySelector(`a[href="${CSS.escape(found.href)}"]`)) return;
    $("nav-hints").append(el("li", { dataset: { tool: event.tool, target: event.target } },
      el("a", { href: found.href, target: "_blank", rel: "noopener" }, found.words,
        el("span", { class: "visually-hidden" }, " (opens a new call in a new tab)"))));
    $("suggestions").hidden = false;
  }

  function observerWords(action) {
    const mode = action && (action.mode || action.kind);
    if (mode === "meeting") return "start recording a meeting";
    if (mode === "voice_memo") return "start recording a voice memo";
    return mode ? `request: ${mode}` : "a request";
  }

  function itemHasWords(itemId) {
    const node = itemId && $("conversation").querySelector(`li[data-item-id="${CSS.escape(itemId)}"]`);
    return Boolean(node && node.dataset.final);
  }

  // --- the data channel's server events --------------------------------------------------

  function onServerEvent(event) {
    switch (event.type) {
      case "conversation.item.added":
      case "conversation.item.created":
        if (event.item) itemNode(event.item.id, event.item.role, event.previous_item_id);
        break;
      case "conversation.item.input_audio_transcription.delta":
        setWords(event.item_id, "user", event.delta || "", { append: true });
        break;
      case "conversation.item.input_audio_transcription.completed":
        setWords(event.item_id, "user", event.transcript || "", { final: true });
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        setWords(event.item_id, "assistant", event.delta || "", { append: true });
        break;
      case "response.output_audio_transcript.done":
      case "response.output_text.done":
        setWords(event.item_id, "assistant", event.transcript ?? event.text ?? "", { final: true });
        break;
      case "response.done": {
        const response = event.response || {};
        if (response.status === "cancelled") {
          markInterrupted((response.output || []).map((item) => item.id).filter(Boolean));
          $("tools").append(el("li", { class: "barge-in", dataset: { responseId: response.id || "" } },
            "you spoke over the assistant: it stopped its reply"));
        }
        break;
      }
      case "error":
        $("tools").append(el("li", { class: "service-error" },
          `the voice service reported a problem: ${(event.error && event.error.message) || "no details"}`));
        break;
    }
  }

  // --- microphone level ----------------------------------------------------------------------

  function startMeter(stream) {
    const context = new AudioContext();
    const analyser = context.createAnalyser();
    analyser.fftSize = 512;
    context.createMediaStreamSource(stream).connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    let frame = 0;
    const tick = () => {
      analyser.getFloatTimeDomainData(samples);
      let sum = 0;
      for (const s of samples) sum += s * s;
      $("mic-level").value = Math.min(1, Math.sqrt(sum / samples.length) * 4);
      frame = requestAnimationFrame(tick);
    };
    tick();
    return () => { cancelAnimationFrame(frame); $("mic-level").value = 0; context.close().catch(() => {}); };
  }

  // --- the call ----------------------------------------------------------------------------

  async function microphone() {
    if (!window.isSecureContext || !navigator.mediaDevices)
      throw new CallFailure("microphone", "The microphone needs a secure page: open the console on localhost or over https, then retry.");
    try {
      return await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (e) {
      if (e && (e.name === "NotAllowedError" || e.name === "SecurityError"))
        throw new CallFailure("microphone", "The microphone was refused. Allow this page to use the microphone (the icon in the address bar), then retry.");
      if (e && e.name === "NotFoundError")
        throw new CallFailure("microphone", "No microphone was found. Connect one, then retry.");
      throw new CallFailure("microphone", `The microphone could not be opened (${e && e.name}). Retry.`);
    }
  }

  async function sendOffer(pc, key) {
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    let response;
    try {
      response = await fetch(`${config.realtime_base_url}/realtime/calls`, {
        method: "POST", body: offer.sdp, credentials: "omit", cache: "no-store",
        headers: { "Content-Type": "application/sdp", "Authorization": `Bearer ${key}` },
      });
    } catch (e) {
      throw new CallFailure("webrtc", `The call could not connect: the voice service at ${config.realtime_base_url} could not be reached. Check the network, then retry.`);
    }
    if (response.status !== 201 && response.status !== 200)
      throw new CallFailure("webrtc", `The call could not connect: the voice service refused it (${response.status}). Retry.`);
    const location = response.headers.get("Location") || "";
    const callId = location.split("/").filter(Boolean).pop();
    if (!callId) throw new CallFailure("webrtc", "The call could not connect: the voice service answered without a call id. Retry.");
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    return callId;
  }

  function channelOpen(channel) {
    return new Promise((resolve, reject) => {
      if (channel.readyState === "open") return resolve();
      const timer = setTimeout(() => reject(new CallFailure("webrtc",
        "The call could not connect: its audio connection did not open. Check the network (or a firewall), then retry.")), CHANNEL_OPEN_TIMEOUT_MS);
      channel.addEventListener("open", () => { clearTimeout(timer); resolve(); }, { once: true });
      channel.addEventListener("close", () => { clearTimeout(timer); reject(new CallFailure("webrtc",
        "The call could not connect: its audio connection closed before it opened. Retry.")); }, { once: true });
    });
  }

  function follow(callId) {
    const source = new EventSource(`/api/voice/events?call_id=${encodeURIComponent(callId)}`);
    source.onmessage = (message) => {
      try { onFeedEvent(JSON.parse(message.data)); } catch (e) { console.warn("unreadable feed event"); }
    };
    source.onerror = async () => {
      if (!call || call.ended) return;
      // The feed ends after call.ended; any other break: is the server still there?
      try {
        await api("GET", "/api/voice/status");
      } catch (e) {
        if (e instanceof ApiFailure && e.kind === "server-gone") {
          endCall("ended: the voice server went away");
          showError(e.message, "server-gone");
        }
      }
    };
    return source;
  }

  // ``continues``: the id of a call that ended at its time limit, for a new call that picks it up.
  // The service chosen on the page (the choice is shown when the server offers both).
  function chosenService() {
    const checked = document.querySelector('input[name="service"]:checked');
    return checked ? checked.value : "realtime";
  }

  function showServiceChoice() {
    const offered = (config && config.services) || ["realtime"];
    $("service-choice").hidden = offered.length < 2;
    const preferred = offered.includes(config.service) ? config.service : offered[0];
    for (const input of document.querySelectorAll('input[name="service"]')) input.checked = input.value === preferred;
  }

  // A Live call: the server creates the session from this page's offer and attaches to it.
  async function startLive(mine, linked, about) {
    setState("connecting", "opening the microphone…");
    mine.stream = await microphone();
    if (mine.ended) return stopTracks(mine);
    mine.stopMeter = startMeter(mine.stream);
    const pc = new RTCPeerConnection();
    mine.pc = pc;
    for (const track of mine.stream.getAudioTracks()) pc.addTrack(track, mine.stream);
    pc.ontrack = (event) => { $("remote-audio").srcObject = event.streams[0]; };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed" && !mine.ended && mine === call) {
        endCall("ended: the audio connection broke", "webrtc", mine);
        showError("The call dropped: the audio connection to the voice service broke. Retry.", "webrtc");
      }
    };
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    setState("connecting", "calling the voice service…");
    const session = await api("POST", "/api/voice/live", {
      sdp: offer.sdp, ...about, ...(linked || mine.continues ? { greeting: "first" } : {}) });
    if (mine.ended) return;
    showAbout(session.context, session.context);
    showContinues(session.continues);
    mine.callId = session.session_id;
    document.body.dataset.callId = mine.callId;
    document.body.dataset.service = "live";
    $("detail-call-id").textContent = mine.callId;
    $("call-details").hidden = false;
    await pc.setRemoteDescription({ type: "answer", sdp: session.sdp });
    mine.source = follow(mine.callId);
    $("live").hidden = false;
    mine.live = true;
    setState("live", "");
  }

  async function start(continues = null) {
    clearError();
    $("call-usage").hidden = true;
    resetView();
    capped = null;
    setState("connecting", "getting a session…");
    call = { ended: false, pc: null, channel: null, source: null, stopMeter: null, stream: null, callId: null,
             continues };
    const mine = call;
    const linked = linkedContext();
    const about = { ...(linked ? { context: linked } : {}), ...(continues ? { continues } : {}) };
    try {
      if (chosenService() === "live") return await startLive(mine, linked, about);
      const session = await api("POST", "/api/voice/session", about);
      if (mine.ended) return;
      showAbout(session.context, session.context);
      showContinues(session.continues);
      setState("connecting", "opening the microphone…");
      mine.stream = await microphone();
      if (mine.ended) return stopTracks(mine);   // hung up while the microphone opened
      mine.stopMeter = startMeter(mine.stream);
      const pc = new RTCPeerConnection();
      mine.pc = pc;
      for (const track of mine.stream.getAudioTracks()) pc.addTrack(track, mine.stream);
      pc.ontrack = (event) => { $("remote-audio").srcObject = event.streams[0]; };
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed" && !mine.ended && mine === call) {
          endCall("ended: the audio connection broke", "webrtc", mine);
          showError("The call dropped: the audio connection to the voice service broke. Retry.", "webrtc");
        }
      };
      const channel = pc.createDataChannel("oai-events");
      mine.channel = channel;
      channel.onmessage = (message) => {
        try { onServerEvent(JSON.parse(message.data)); } catch (e) { console.warn("unreadable server event"); }
      };
      setState("connecting", "calling the voice service…");
      mine.callId = await sendOffer(pc, session.ephemeral_key);
      document.body.dataset.callId = mine.callId;
      $("detail-call-id").textContent = mine.callId;
      $("call-details").hidden = false;
      await channelOpen(channel);
      if (mine.ended) return;
      // The channel closes first on a hangup; the feed's call.ended (with the
      // reason) follows within moments — wait briefly for it.
      channel.addEventListener("close", () => setTimeout(() => endCall("ended: the call was closed", null, mine), FEED_END_GRACE_MS));
      setState("connecting", "handing the call to the voice server…");
      // with a context, the assistant speaks first and names what the server verified;
      // continuing a call, it says it picks the conversation up
      await api("POST", "/api/voice/connect", linked || continues
        ? { call_id: mine.callId, ...about, greeting: "first" } : { call_id: mine.callId });
      if (mine.ended) return;
      mine.source = follow(mine.callId);
      $("live").hidden = false;
      mine.live = true;
      setState("live", "");
    } catch (e) {
      // already ended (Hang up while connecting): what failed since is a consequence
      if (mine.ended || mine !== call) return endCall("", null, mine);
      endCall("ended: it did not start", null, mine);
      if (e instanceof ApiFailure && e.kind === "unauthorized") return showSignIn(e.message);
      const badLink = (linked && linkError(e, linked)) || (continues && continuesError(e, continues));
      if (badLink) return showError(badLink, "link", { href: "/", words: "Open the console without the link" });
      showError(e.message || String(e), e.kind || "error");
    }
  }

  function stopTracks(resources) {
    if (resources.stream) for (const track of resources.stream.getTracks()) track.stop();
  }

  // End a call's resources (the current call unless told which); only the
  // current call's end changes what the page shows.
  function endCall(words, why, resources = call) {
    if (!resources || resources.ended) return;
    resources.ended = true;
    if (resources.source) resources.source.close();
    if (resources.channel && resources.channel.readyState !== "closed") resources.channel.close();
    if (resources.pc) resources.pc.close();
    if (resources.stopMeter) resources.stopMeter();
    stopTracks(resources);
    if (resources !== call) return;
    $("remote-audio").srcObject = null;
    for (const turn of $("conversation").querySelectorAll("[aria-busy]")) turn.removeAttribute("aria-busy");
    document.body.dataset.endReason = why || words;
    $("detail-end-reason").textContent = why || "—";
    // ended at its time limit: Continue starts a new call that picks it up
    capped = resources.callId && CONTINUABLE.has(why) ? resources.callId : null;
    setState("ended", words.replace(/^ended: /, ""), resources.live ? "call ended" : "no call");
  }

  function resetView() {
    for (const id of ["conversation", "tools", "nav-hints", "observer"]) $(id).replaceChildren();
    $("suggestions").hidden = true;
    $("observer-box").hidden = true;
    $("call-details").hidden = true;
    $("detail-call-id").textContent = "—";
    $("detail-end-reason").textContent = "—";
    showAbout(null, null);
    showAgent(null);
    showContinues(null);
    delete document.body.dataset.callId;
    delete document.body.dataset.endReason;
    delete document.body.dataset.service;
  }

  // --- sign-in --------------------------------------------------------------------------------

  function showSignIn(message) {
    $("call-panel").hidden = true;
    $("live").hidden = true;
    $("signin-panel").hidden = false;
    $("logout").hidden = true;
    const error = $("signin-error");
    error.hidden = !message;
    error.textContent = message || "";
    $("token").focus();
  }

  function showConsole() {
    $("signin-panel").hidden = true;
    $("call-panel").hidden = false;
    $("logout").hidden = !config.token_required;
    $("demo-badge").hidden = !config.demo;
    $("demo-note").hidden = !config.demo;
    $("mic-level").title = config.demo ? "the demo does not listen to it" : "";
    showNotices(config.notices);
    showServiceChoice();
  }

  async function signIn(event) {
    event.preventDefault();
    const field = $("token");
    const token = field.value;
    field.value = "";          // the token lives nowhere in the page after this
    try {
      await api("POST", "/api/voice/login", { token });
      config = await api("GET", "/api/voice/console-config");   // now with what a signed-in page is told
      showConsole();
      $("start").focus();
    } catch (e) {
      showSignIn(e.kind === "unauthorized" ? "That token was not accepted." : e.message);
    }
  }

  async function signOut() {
    endCall("ended: signed out");
    try { await api("POST", "/api/voice/logout", {}); } catch (e) { /* the cookie is gone either way */ }
    config.signed_in = false;
    showSignIn("");
  }

  async function boot() {
    $("start").addEventListener("click", () => start(continuesParam()));
    $("continue").addEventListener("click", () => start(capped));
    // a retry tries the same call again: the same continuation, if it was one
    $("retry").addEventListener("click", () => (config ? start(call ? call.continues : continuesParam()) : location.reload()));
    $("hangup").addEventListener("click", () => endCall("ended: you hung up", "hangup"));
    $("signin").addEventListener("submit", signIn);
    $("logout").addEventListener("click", signOut);
    setState("idle", "press Start to talk");
    try {
      config = await api("GET", "/api/voice/console-config");
    } catch (e) {
      $("call-panel").hidden = false;
      $("start").hidden = true;
      showError(e.message, e.kind);
      return;
    }
    if (config.token_required && !config.signed_in) showSignIn("");
    else showConsole();
    document.body.dataset.ready = "1";
  }

  boot();
})();
