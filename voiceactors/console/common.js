// Shared by the console pages: same-origin JSON requests and plain-words errors.
"use strict";

const VA = (() => {
  // Our API's error strings (docs/api.md) → what the person reads.
  const MESSAGES = {
    // the journal's key is read again at each call; OPENAI_API_KEY only when the server starts
    "voice unavailable — openai key not configured":
      "No OpenAI key is configured on the server, so no call can start. Put voice.openai_api_key in the journal's " +
      "config/journal.json and press Retry (it is read again, no restart needed), or restart the server with " +
      "OPENAI_API_KEY set.",
    "voice unavailable — brain not ready":
      "The assistant is still reading your journal (brain not ready). Retry in a moment.",
    "voice unavailable — budget spent":
      "Today's spending limit for voice calls is reached (budget spent). Voice is back tomorrow.",
    "voice at capacity":
      "The voice server is at capacity: too many calls are live. Retry when one has ended.",
    "voice session unavailable":
      "The voice service did not start a session. Retry; if it keeps failing, the server's log says why.",
    "voice runtime unavailable":
      "The voice server is not ready to take calls. Retry; if it keeps failing, restart the server.",
    "voice unavailable — runtime failed":
      "The voice server failed and is stopping (whatever runs it starts it again). Retry in a moment.",
    "unauthorized": "You are not signed in (or your session expired). Sign in again.",
    "call not found": "The call has already ended on the server.",
    "cross-site request refused": "The server refused a request from another site. Open the console at the server's own address.",
  };

  class ApiFailure extends Error {
    constructor(kind, message, status, error) {
      super(message);
      this.kind = kind;        // "api" | "server-gone" | "unauthorized"
      this.status = status;
      this.error = error;      // the API's own error string, for a page that says it better
    }
  }

  function explain(status, error) {
    if (status === 401) return new ApiFailure("unauthorized", MESSAGES.unauthorized, status, error);
    // a failed runtime ended every call of its process: for a live call, the server is gone
    if (error === "voice unavailable — runtime failed") return new ApiFailure("server-gone", MESSAGES[error], status, error);
    const words = MESSAGES[error] || `The server answered ${status}${error ? ": " + error : ""}.`;
    return new ApiFailure("api", words, status, error);
  }

  // A same-origin JSON request; resolves to the parsed body or throws ApiFailure.
  async function api(method, path, body) {
    const init = { method, headers: {}, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiFailure("server-gone", "The voice server is not answering (stopped, or the network is down). Retry when it is back.", 0);
    }
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) throw explain(response.status, data && data.error);
    return data;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    const m = Math.floor(seconds / 60), s = Math.round(seconds % 60);
    return `${m} min ${s} s`;
  }

  function when(iso) {
    if (!iso) return "—";
    const date = new Date(iso);
    return isNaN(date) ? iso : date.toLocaleString();
  }

  // Why a call ended, in a person's words (the reason codes of docs/calls.md;
  // the code itself belongs in a details view, see ``reasonCode``).
  const REASONS = {
    closed_by_service: "it ended normally",
    hangup: "you hung up",
    call_gone: "the voice service no longer knew the call",
    idle_timeout: "the voice service went quiet for too long",
    max_duration: "the call reached its maximum length",
    reconnect_exhausted: "the connection to the voice service was lost",
    no_api_key: "the server has no OpenAI key",
    config_unreadable: "the journal's config could not be read",
    unauthorized: "the voice service refused the server's OpenAI key",
    insufficient_quota: "the OpenAI account is out of credit",
    session_expired: "the voice service's session reached its 60-minute limit",
    shutdown: "the server shut down",
    budget_spent: "the call reached its spending limit",
    user_idle: "nobody answered the assistant's check-in",
    auth_expired: "a connected service refused the call's access",
    error: "the server hit an error (see its log)",
  };
  function reason(text) {
    if (!text) return "still going, or cut short (no end recorded)";
    return REASONS[text] || text.replace(/_/g, " ");
  }

  // A cost in US dollars (null: the model has no prices).
  function money(usd) {
    if (usd === null || usd === undefined) return "unknown";
    return `$${Number(usd).toFixed(4)}`;
  }

  // What a tool does, in words (the tool's own name stays in a tooltip).
  const TOOLS = {
    "journal.get_day": "read a day of the journal",
    "journal.search": "searched the journal",
    "entities.get": "looked up who or what someone is",
    "entities.recent_with": "looked up recent time with someone",
    "commitments.list": "listed your commitments",
    "commitments.complete": "marked a commitment as finished",
    "calendar.today": "read today's calendar",
    "briefing.get": "read today's briefing",
    "observer.start_listening": "asked your observer to start recording",
    "journal.select": "changed what the call is about",
  };
  function toolWords(name) {
    return TOOLS[name] || TOOLS[String(name).replace("_", ".")] || `used ${name}`;
  }

  return { api, ApiFailure, el, duration, when, reason, money, toolWords };
})();
