// The chat page: conversations in localStorage, replies streamed from /v1/chat/completions
// (SSE), Stop aborts the request (the server cancels a sequence whose client went away).
// Paths are relative, so the page also works behind a reverse proxy under a sub-path.
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const KEYS = { conversations: "edgeinfer.conversations", settings: "edgeinfer.settings",
               apiKey: "edgeinfer.apiKey" };
const SAMPLING = ["temperature", "top_p", "top_k", "max_tokens", "seed"];

const state = {
  conversations: load(KEYS.conversations, []),  // [{id, title, messages: [...]}], newest first
  settings: load(KEYS.settings, {}),
  currentId: null,
  controller: null,  // the AbortController of the reply being streamed
};
const views = new WeakMap();  // message -> its element on the page

function load(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    showStatus(`Could not save to this browser's storage: ${err.message}`);
  }
}

function showStatus(text) {
  $("status").textContent = text;
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function current() {
  return state.conversations.find((c) => c.id === state.currentId) ?? null;
}

// -- the API ---------------------------------------------------------------------------------

/** fetch() with the stored API key; a 401 asks for a key once and tries again. */
async function api(path, init = {}, asked = false) {
  const key = localStorage.getItem(KEYS.apiKey);
  const headers = { ...init.headers };
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401 && !asked && (await askKey())) return api(path, init, true);
  if (!response.ok) throw new Error(await errorMessage(response));
  return response;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message ?? `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

let keyPrompt = null;  // the open dialog's answer: requests failing together share it

/** Show the key dialog; true once a key is saved, false if cancelled. */
function askKey() {
  keyPrompt ??= promptForKey().finally(() => { keyPrompt = null; });
  return keyPrompt;
}

function promptForKey() {
  const dialog = $("key-dialog");
  $("api-key").value = "";
  dialog.showModal();
  return new Promise((resolve) => {
    const done = (saved) => {
      $("key-form").onsubmit = $("key-cancel").onclick = dialog.oncancel = null;
      dialog.close();
      resolve(saved);
    };
    $("key-form").onsubmit = (event) => {
      event.preventDefault();
      localStorage.setItem(KEYS.apiKey, $("api-key").value.trim());
      done(true);
    };
    $("key-cancel").onclick = () => done(false);
    dialog.oncancel = () => done(false);
  });
}

/** The data lines of a server-sent event stream, one string per event. */
async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      buffer = buffer.slice(end + 2);
      if (data) yield data;
    }
  }
}

async function loadModels() {
  const select = $("model");
  try {
    const { data } = await (await api("v1/models")).json();
    select.replaceChildren(...data.map((m) => new Option(m.id, m.id)));
    if (data.some((m) => m.id === state.settings.model)) select.value = state.settings.model;
  } catch (err) {
    showStatus(`Could not list the models: ${err.message}`);
  }
}

// -- drawing ---------------------------------------------------------------------------------

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren(...state.conversations.map((conv) => {
    const item = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = conv.title;
    if (conv.id === state.currentId) open.setAttribute("aria-current", "true");
    open.onclick = () => switchTo(conv.id);
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "delete";
    remove.textContent = "×";
    remove.title = "Delete";
    remove.setAttribute("aria-label", `Delete conversation: ${conv.title}`);
    remove.onclick = () => deleteConversation(conv.id);
    item.append(open, remove);
    return item;
  }));
}

function renderMessages() {
  const conv = current();
  $("messages").replaceChildren(...(conv?.messages ?? []).map(messageView));
  scrollToEnd(true);
}

function messageView(msg) {
  const view = document.createElement("article");
  view.className = `message ${msg.role}`;
  const who = document.createElement("h2");
  who.className = "who";
  who.textContent = msg.role === "user" ? "You" : "Assistant";
  const body = document.createElement("div");
  body.className = "content";
  const stats = document.createElement("p");
  stats.className = "stats";
  view.append(who, body, stats);
  views.set(msg, view);
  fillMessage(msg, view);
  return view;
}

function fillMessage(msg, view) {
  const body = view.querySelector(".content");
  const parts = [];
  if (msg.reasoning) {
    const thinking = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    text.className = "reasoning";
    text.textContent = msg.reasoning;
    thinking.append(summary, text);
    parts.push(thinking);
  }
  parts.push(renderMarkdown(msg.content));
  body.replaceChildren(...parts);
  addCopyButtons(body);
  view.querySelector(".stats").textContent = statsLine(msg);
  view.classList.toggle("failed", Boolean(msg.error));
}

function addCopyButtons(body) {
  if (!navigator.clipboard) return;  // only in secure contexts (localhost, https)
  for (const pre of body.querySelectorAll("pre")) {
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.onclick = async () => {
      await navigator.clipboard.writeText(pre.querySelector("code").textContent);
      copy.textContent = "Copied";
    };
    pre.prepend(copy);
  }
}

function statsLine(msg) {
  const parts = [];
  const t = msg.timings;
  if (t) {
    parts.push(`${t.predicted_n} tokens, ${t.predicted_per_second.toFixed(1)} tokens/s`);
    parts.push(`prompt ${t.prompt_n} tokens at ${t.prompt_per_second.toFixed(1)} tokens/s, `
               + `${t.cache_n} cached`);
  }
  if (msg.stopped) parts.push("stopped");
  if (msg.error) parts.push(`error: ${msg.error}`);
  return parts.join(" · ");
}

const pending = new Set();  // messages whose view is redrawn on the next frame

function refresh(msg) {
  if (pending.size === 0) {
    requestAnimationFrame(() => {
      const near = isNearEnd();
      for (const m of pending) {
        const view = views.get(m);
        if (view?.isConnected) fillMessage(m, view);
      }
      pending.clear();
      scrollToEnd(near);
    });
  }
  pending.add(msg);
}

function isNearEnd() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollToEnd(really) {
  if (really) $("messages").scrollTop = $("messages").scrollHeight;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("messages").setAttribute("aria-busy", String(busy));
  if (!busy) $("prompt").focus();
}

// -- actions ---------------------------------------------------------------------------------

function switchTo(id) {
  state.currentId = id;
  renderConversations();
  renderMessages();
  showStatus("");
}

function deleteConversation(id) {
  state.conversations = state.conversations.filter((c) => c.id !== id);
  save(KEYS.conversations, state.conversations);
  if (state.currentId === id) state.currentId = null;
  renderConversations();
  renderMessages();
}

function requestBody(conv) {
  const s = state.settings;
  const messages = conv.messages.filter((m) => m.content)  // not failed or empty replies
    .map(({ role, content }) => ({ role, content }));
  if (s.system?.trim()) messages.unshift({ role: "system", content: s.system });
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if ($("model").value) body.model = $("model").value;
  for (const name of SAMPLING) {
    if (s[name] !== undefined && s[name] !== "") body[name] = Number(s[name]);
  }
  return body;
}

async function send(text) {
  let conv = current();
  if (!conv) {
    conv = { id: newId(), title: text.slice(0, 60), messages: [] };
    state.conversations.unshift(conv);
    state.currentId = conv.id;
    renderConversations();
  }
  conv.messages.push({ role: "user", content: text });
  const body = requestBody(conv);
  const reply = { role: "assistant", content: "" };
  conv.messages.push(reply);
  save(KEYS.conversations, state.conversations);
  renderMessages();
  showStatus("");
  state.controller = new AbortController();
  setBusy(true);
  try {
    await streamReply(body, reply, state.controller.signal);
  } catch (err) {
    if (err.name === "AbortError") reply.stopped = true;
    else reply.error = err.message;
  } finally {
    state.controller = null;
    save(KEYS.conversations, state.conversations);
    refresh(reply);
    setBusy(false);
  }
}

async function streamReply(body, reply, signal) {
  const response = await api("v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body), signal,
  });
  for await (const data of sseData(response)) {
    if (data === "[DONE]") break;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message);
    const delta = chunk.choices?.[0]?.delta ?? {};
    reply.content += delta.content ?? "";
    reply.reasoning = (reply.reasoning ?? "") + (delta.reasoning_content ?? "");
    if (chunk.timings) reply.timings = chunk.timings;
    refresh(reply);
  }
}

// -- wiring ----------------------------------------------------------------------------------

function initSettings() {
  const s = state.settings;
  $("system").value = s.system ?? "";
  for (const name of SAMPLING) $(name).value = s[name] ?? "";
  for (const name of ["system", ...SAMPLING]) {
    $(name).addEventListener("change", () => {
      s[name] = $(name).value;
      save(KEYS.settings, s);
    });
  }
  $("model").addEventListener("change", () => {
    s.model = $("model").value;
    save(KEYS.settings, s);
  });
  $("settings-toggle").addEventListener("click", () => {
    const panel = $("settings");
    panel.hidden = !panel.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!panel.hidden));
  });
}

function initComposer() {
  const prompt = $("prompt");
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text || state.controller) return;
    prompt.value = "";
    send(text);
  });
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("new-chat").addEventListener("click", () => {
    switchTo(null);
    prompt.focus();
  });
}

initSettings();
initComposer();
state.currentId = state.conversations[0]?.id ?? null;
renderConversations();
renderMessages();
setBusy(false);
loadModels();
