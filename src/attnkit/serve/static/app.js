// attnkit's web page: translate with /v1/translate, draw the result's attention with the
// viewer page that /v1/attention returns (the same viewer as `attnkit attention --out F.html`,
// shown in an iframe), and stream /v1/generate's Server-Sent Events into the page. Nothing
// is fetched from anywhere but this server.
//
// For tests and curious people, <body> carries data-translate and data-generate
// ("idle", "busy", "done", "error") and data-pieces (streamed pieces so far).
(function () {
  "use strict";

  function $(id) { return document.getElementById(id); }
  var body = document.body;

  function errorText(data, response) {
    if (data && data.error && data.error.message) return data.error.message;
    return "HTTP " + response.status + " " + response.statusText;
  }

  function postJSON(path, payload, signal) {
    return fetch(path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(payload),
      signal: signal
    }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (data) {
        if (!response.ok) throw new Error(errorText(data, response));
        return data;
      });
    });
  }

  function showError(id, message) {
    var el = $(id);
    el.hidden = !message;
    el.textContent = message || "";
  }

  // ------------------------------------------------------------------ server status

  function checkStatus() {
    fetch("/readyz").then(function (r) { return r.json(); }).then(function (data) {
      var models = data.models || {};
      var status = $("status");
      var missing = [];
      if (!models.translation) { off("translate", "no translation model is loaded"); missing.push("translation"); }
      if (!models.gpt) { off("generate", "no GPT model is loaded (start the server with --gpt-model DIR)"); missing.push("GPT"); }
      status.textContent = data.ready
        ? "Ready" + (missing.length ? " (without " + missing.join(", ") + ")" : "") + "."
        : (data.draining ? "The server is shutting down." : "The server is starting…");
      status.className = data.ready ? "status" : "status bad";
    }).catch(function () {
      $("status").textContent = "The server does not answer.";
      $("status").className = "status bad";
    });
  }

  function off(name, message) {
    $(name + "-section").classList.add("off");
    $(name + "-button").disabled = true;
    showError(name + "-error", message);
  }

  // ------------------------------------------------------------------ translation + heatmap

  var frame = $("viewer-frame");
  frame.addEventListener("load", function () {
    try {  // same origin (srcdoc): fit the frame to the viewer
      var doc = frame.contentDocument;
      if (doc && doc.body && doc.body.childElementCount) {
        frame.style.height = Math.min(900, doc.documentElement.scrollHeight + 40) + "px";  // + room for the hover list
      }
    } catch (e) { /* keep the default height */ }
  });

  $("translate-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var text = $("source").value.trim();
    var beam = parseInt($("beam").value, 10) || 5;
    if (!text) return;
    var button = $("translate-button");
    button.disabled = true;
    body.dataset.translate = "busy";
    showError("translate-error", "");
    $("translation").textContent = "…";
    postJSON("/v1/translate", { texts: [text], beam: beam }).then(function (data) {
      var target = data.translations[0];
      $("translation").textContent = target;
      return postJSON("/v1/attention", { text: text, target: target, beam: beam, html: true });
    }).then(function (maps) {
      frame.srcdoc = maps.viewer_html;
      body.dataset.translate = "done";
    }).catch(function (err) {
      $("translation").textContent = "";
      showError("translate-error", err.message);
      body.dataset.translate = "error";
    }).then(function () { button.disabled = false; });
  });

  // ------------------------------------------------------------------ generation (SSE)

  var controller = null;

  function parseEvents(buffer, onEvent) {  // returns what is left after the complete events
    var at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      var block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      var name = "message", data = [];
      block.split("\n").forEach(function (line) {
        if (line.indexOf("event:") === 0) name = line.slice(6).trim();
        else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
      });
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
    return buffer;
  }

  function finish(state) {
    body.dataset.generate = state;
    $("generate-button").disabled = false;
    $("stop-button").disabled = true;
    controller = null;
  }

  $("generate-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var prompt = $("prompt").value;
    var payload = {
      prompt: prompt,
      max_new_tokens: parseInt($("max-new-tokens").value, 10) || 64,
      temperature: parseFloat($("temperature").value) || 0,
      stream: true
    };
    controller = new AbortController();
    $("generate-button").disabled = true;
    $("stop-button").disabled = false;
    showError("generate-error", "");
    $("generated-prompt").textContent = prompt;
    var out = $("generated-text");
    out.textContent = "";
    body.dataset.generate = "busy";
    body.dataset.pieces = "0";
    var pieces = 0, failed = null;

    fetch("/v1/generate", {
      method: "POST",
      headers: { "content-type": "application/json", "accept": "text/event-stream" },
      body: JSON.stringify(payload),
      signal: controller.signal
    }).then(function (response) {
      if (!response.ok) {
        return response.json().catch(function () { return null; }).then(function (data) {
          throw new Error(errorText(data, response));
        });
      }
      var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "";
      function pump() {
        return reader.read().then(function (chunk) {
          if (chunk.done) return;
          buffer = parseEvents(buffer + decoder.decode(chunk.value, { stream: true }), function (name, data) {
            if (name === "message") {
              out.textContent += data.text;
              body.dataset.pieces = String(++pieces);
            } else if (name === "error") {
              failed = data.error ? data.error.message : "generation failed";
            }
          });
          return pump();
        });
      }
      return pump();
    }).then(function () {
      if (failed) { showError("generate-error", failed); finish("error"); } else finish("done");
    }).catch(function (err) {
      if (err.name === "AbortError") { finish("stopped"); return; }
      showError("generate-error", err.message);
      finish("error");
    });
  });

  $("stop-button").addEventListener("click", function () {
    if (controller) controller.abort();  // the server stops the generation when we hang up
  });

  body.dataset.translate = "idle";
  body.dataset.generate = "idle";
  checkStatus();
})();
