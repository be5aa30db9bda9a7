// SEMQ web console: the inbox's Acknowledge button and the send page,
// over the node's HTTP API (/api/v1) with the session's CSRF token.
// Every value is set as text (textContent), never as HTML.
"use strict";
(function () {
  function say(id, text, bad) {
    const e = document.getElementById(id);
    if (!e) return;
    e.textContent = text;
    e.className = bad ? "note bad" : "note";
  }
  async function answer(r) {
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) throw new Error((body && body.error) || ("HTTP " + r.status));
    return body;
  }
  const ack = document.getElementById("ack");
  if (ack) {
    ack.addEventListener("click", async function () {
      ack.disabled = true;
      try {
        const got = await answer(await fetch("/api/v1/inbox/ack", {
          method: "POST", credentials: "same-origin",
          headers: { "content-type": "application/json", "x-csrf-token": ack.dataset.csrf },
          body: JSON.stringify({ ids: [Number(ack.dataset.id)] }),
        }));
        say("ack-result", got.acknowledged ? "Acknowledged." : "It was acknowledged already.");
        const st = document.getElementById("doc-state");
        if (st) st.textContent = "acknowledged";
        ack.remove();
      } catch (e) {
        ack.disabled = false;
        say("ack-result", "Not acknowledged: " + e.message, true);
      }
    });
  }
  const form = document.getElementById("send-form");
  if (form) {
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      const file = form.elements.file.files[0];
      if (!file) { say("send-result", "Choose a file.", true); return; }
      const q = new URLSearchParams();
      for (const k of ["to", "data_type", "domain", "key"]) {
        const v = form.elements[k].value.trim();
        if (v) q.set(k, v);
      }
      const button = document.getElementById("send-button");
      button.disabled = true;
      say("send-result", "Sending " + file.name + " (" + file.size.toLocaleString("en") + " bytes)…");
      try {
        const got = await answer(await fetch("/api/v1/documents?" + q.toString(), {
          method: "POST", credentials: "same-origin", body: file,
          headers: { "content-type": "application/octet-stream", "x-csrf-token": form.dataset.csrf },
        }));
        const p = document.getElementById("send-result");
        p.className = "note";
        p.textContent = "Accepted by this node (durable) as ";
        const a = document.createElement("a");
        a.href = "/doc?lk0=" + encodeURIComponent(got.lk0);
        a.textContent = got.lk0;
        a.id = "sent-lk0";
        p.appendChild(a);
        p.appendChild(document.createTextNode(", " + got.size.toLocaleString("en") + " bytes, SHA-256 " + got.sha256 + "."));
      } catch (e) {
        // (a refused body over 16 MiB is not read: the node closes the connection before the file is sent)
        say("send-result", "Not sent: " + (e instanceof TypeError ? "the node closed the connection before the"
            + " file was sent (check the target and options, or see the node's log)" : e.message), true);
      } finally {
        button.disabled = false;
      }
    });
  }
})();
