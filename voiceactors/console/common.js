// Shared by the console pages: same-origin JSON requests and plain-words errors.
"use strict";

const VA = (() => {
  // Our API's error strings (docs/api.md) → what the person reads.
  const MESSAGES = {
    "voice unavailable — openai key not configured":
      "No OpenAI key is configured on the server. Set OPENAI_API_KEY (or voice.openai_api_key in the journal config), then retry.",
    "voice unavailable — brain not ready":
      "The assistant is still reading your journal (brain not ready). Retry in a moment.",
    "voice unavailable — budget spent":
      "Today's spending limit for voice calls is reached (budget spent). Voice is back tomorrow.",
    "voice at capacity":
      "The voice server is at capacity: too many calls are live. Retry when one has ended.",
    "voice session unavailable":
      "The Realtime service did not give us a session. Retry; if it keeps failing, check the server's log.",
    "voice runtime unavailable":
      "The voice server's runtime is not running. Retry; if it keeps failing, restart the server.",
    "voice unavailable — runtime failed":
      "The voice server's runtime failed and the server is stopping (a supervisor starts it again). Retry in a moment.",
    "unauthorized": "You are not signed in (or your session expired). Sign in again.",
    "call not found": "The call is not live on the server any more.",
    "cross-site request refused": "The server refused a cross-site request.",
  };

  class ApiFailure extends Error {
    constructor(kind, message, status) {
      super(message);
      this.kind = kind;        // "api" | "server-gone" | "unauthorized"
      this.status = status;
    }
  }

  function explain(status, error) {
    if (status === 401) return new ApiFailure("unauthorized", MESSAGES.unauthorized, status);
    // a failed runtime ended every call of its process: for a live call, the server is gone
    if (error === "voice unavailable — runtime failed") return new ApiFailure("server-gone", MESSAGES[error], status);
    const words = MESSAGES[error] || `The server answered ${status}${error ? ": " + error : ""}.`;
    return new ApiFailure("api", words, status);
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

  // Why a call ended, in words (reasons from the call actor and this page).
  const REASONS = {
    closed_by_service: "the call was closed",
    call_gone: "the service no longer knew the call",
    idle_timeout: "no activity for too long",
    max_duration: "the call reached its maximum length",
    reconnect_exhausted: "the connection to the service was lost",
    no_api_key: "the server has no OpenAI key",
    shutdown: "the server shut down",
    budget_spent: "the call reached its spending limit",
    error: "the server hit an error",
  };
  function reason(text) {
    if (!text) return "still live, or cut short (no end recorded)";
    return REASONS[text] ? `${REASONS[text]} (${text})` : text.replace(/_/g, " ");
  }

  // A cost in US dollars (null: the model has no prices).
  function money(usd) {
    if (usd === null || usd === undefined) return "unknown";
    return `$${Number(usd).toFixed(4)}`;
  }

  return { api, ApiFailure, el, duration, when, reason, money };
})();
