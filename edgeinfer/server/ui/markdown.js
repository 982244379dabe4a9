// A small Markdown renderer for chat messages that cannot inject HTML: it builds DOM nodes
// and puts all text in as text nodes (textContent); no string is parsed as HTML. Model output is
// untrusted: `<script>` in it is shown as the characters "<script>".
//
// Supported: fenced code blocks (``` or ~~~, with a language), inline code, **bold**,
// *italic* / _italic_, # headings, - / * / 1. lists (nested ones flattened), > quotes, --- rules and [links](url)
// whose url is http or https (anything else stays text). An unclosed fence runs to the end,
// so a code block renders as it streams.

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const ITEM = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
// code | bold | italic | link, tried left to right at each position
const INLINE = new RegExp([
  /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source,
  /\*\*(?=\S)([\s\S]*?\S)\*\*/.source,
  /__(?=\S)([\s\S]*?\S)__(?!\w)/.source,
  /\*(?=[^\s*])([^*]*?[^\s*])\*/.source,
  /(?<!\w)_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/.source,
  /\[([^\]\n]+)\]\(\s*([^)\s]+)\s*\)/.source,
].join("|"), "g");

function el(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The href for a link's target if it is an absolute http(s) URL, else null. */
export function safeHref(target) {
  try {
    const url = new URL(target);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** Append `text` to `parent` with inline code, emphasis and links as elements. */
export function renderInline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    const [source, , code, bold, bold2, em, em2, label, target] = m;
    if (code !== undefined) {
      parent.append(el("code", code.replace(/^ (.*) $/s, "$1")));
    } else if (bold !== undefined || bold2 !== undefined) {
      renderInline(parent.appendChild(el("strong")), bold ?? bold2);
    } else if (em !== undefined || em2 !== undefined) {
      renderInline(parent.appendChild(el("em")), em ?? em2);
    } else {
      const href = safeHref(target);
      if (href === null) {
        parent.append(source);
      } else {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        renderInline(a, label);
        parent.append(a);
      }
    }
    last = m.index + source.length;
  }
  if (last < text.length) parent.append(text.slice(last));
}

function codeBlock(lines, lang) {
  const pre = el("pre");
  const code = el("code", lines.join("\n"));
  if (lang) {
    code.className = "language-" + lang;
    pre.dataset.lang = lang;
  }
  pre.append(code);
  return pre;
}

function paragraph(lines) {
  const p = el("p");
  lines.forEach((line, i) => {
    if (i > 0) p.append(el("br"));
    renderInline(p, line);
  });
  return p;
}

/** Render Markdown `text` as a DocumentFragment of elements and text nodes. */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const close = new RegExp("^\\s{0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      out.append(codeBlock(body, m[2]));
      i++;
    } else if ((m = HEADING.exec(line))) {
      const level = Math.min(6, m[1].length + 2);  // the page's own h1/h2 stay on top
      renderInline(out.appendChild(el("h" + level)), m[2]);
      i++;
    } else if (RULE.test(line)) {
      out.append(el("hr"));
      i++;
    } else if (ITEM.test(line)) {
      const first = ITEM.exec(line)[2];  // the number of an ordered list
      const ordered = first !== undefined;
      const list = el(ordered ? "ol" : "ul");
      if (ordered && first !== "1") list.start = Number(first);
      while (i < lines.length && (m = ITEM.exec(lines[i])) && (m[2] !== undefined) === ordered) {
        renderInline(list.appendChild(el("li")), m[3]);
        i++;
      }
      out.append(list);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        quoted.push(m[1]);
        i++;
      }
      const quote = el("blockquote");
      quote.append(renderMarkdown(quoted.join("\n")));
      out.append(quote);
    } else if (line.trim() === "") {
      i++;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && !startsBlock(lines[i])) {
        para.push(lines[i]);
        i++;
      }
      out.append(paragraph(para));
    }
  }
  return out;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || ITEM.test(line) || QUOTE.test(line)
    || RULE.test(line);
}
