// The dashboard's live parts, each an EventSource on a stream of server-sent
// events: the job page's event log, progress bar and status (WatchEvents), and
// the owner overview's "Recent events" (Subscribe). Every value is set as text
// (textContent), never as markup. Hand-written; no third-party code.
"use strict";

// The job page: appends each event to the log, moves the progress bar and
// shows the status.
(function () {
  const job = document.getElementById("job");
  if (!job) {
    return;
  }
  const rows = document.querySelector("#events tbody");
  const progress = document.getElementById("progress");
  const progressText = document.getElementById("progress-text");
  const live = document.getElementById("live");

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function showProgress(payload) {
    const step = Number(payload.step);
    const steps = Number(payload.steps);
    if (!(steps > 0) || !(step >= 0)) {
      return;
    }
    progress.max = steps;
    progress.value = Math.min(step, steps);
    progressText.textContent = step + " of " + steps;
  }

  // The server says which actions the new status allows; a button for any
  // other would only lead to a refusal, so it goes. (One the new status
  // newly allows, e.g. Retry once a job has failed, appears on a reload.)
  function dropForbiddenActions(allowed) {
    document.querySelectorAll("form[data-action]").forEach(function (form) {
      if (allowed.indexOf(form.dataset.action) < 0) {
        form.remove();
      }
    });
  }

  const source = new EventSource(job.dataset.eventsUrl);
  source.addEventListener("open", function () {
    live.textContent = "live";
  });
  source.addEventListener("job", function (message) {
    const event = JSON.parse(message.data);
    const row = document.createElement("tr");
    row.className = "event";
    row.dataset.sequence = String(event.sequence);
    cell(row, String(event.sequence));
    cell(row, event.type);
    cell(row, event.created_at);
    cell(row, JSON.stringify(event.payload));
    rows.appendChild(row);
    if (event.type === "progress") {
      showProgress(event.payload);
    } else if (event.type === "job.started") {
      // A new attempt reports its progress from the start again.
      progress.value = 0;
      progressText.textContent = "attempt started";
    }
  });
  source.addEventListener("status", function (message) {
    const job = JSON.parse(message.data);
    const status = document.getElementById("status");
    status.textContent = job.status;
    status.className = "status-" + job.status;
    document.getElementById("attempt").textContent = job.attempt;
    document.getElementById("error").textContent = job.error || "—";
    // Only a page loaded while the job waited has the row.
    const waiting = document.getElementById("waiting");
    if (waiting) {
      waiting.textContent = job.waiting || "—";
    }
    dropForbiddenActions(job.actions || []);
  });
  source.addEventListener("end", function () {
    live.textContent = "finished";
    source.close();
  });
  source.addEventListener("failure", function (message) {
    // The service refused the stream (e.g. too many open watch streams).
    live.textContent = "live updates stopped (" + JSON.parse(message.data).code + "): reload the page";
    source.close();
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      live.textContent = "disconnected: reload the page";
    } else {
      live.textContent = "reconnecting…";
    }
  });
})();

// The owner's overview: "Recent events", newest first, at most data-max-rows
// rows (older ones leave the page). Each message's id is its feed position, so
// after a dropped connection EventSource resumes after the last row shown
// (Last-Event-ID): no gap, no row twice.
(function () {
  const feed = document.getElementById("feed");
  if (!feed) {
    return;
  }
  const rows = feed.querySelector("tbody");
  const empty = document.getElementById("feed-empty");
  const restarted = document.getElementById("feed-restarted");
  const live = document.getElementById("feed-live");
  const maxRows = Number(feed.dataset.maxRows) || 50;

  function cell(row, className, text) {
    const td = document.createElement("td");
    td.className = className;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function jobCell(row, event) {
    const td = cell(row, "job", "");
    const link = document.createElement("a");
    link.href = event.job_url; // built by the server from the job page's route
    const code = document.createElement("code");
    code.textContent = event.job_id;
    link.appendChild(code);
    td.appendChild(link);
  }

  function show(event) {
    const row = document.createElement("tr");
    row.className = "feed-event";
    row.dataset.position = event.position;
    row.dataset.jobId = event.job_id;
    cell(row, "at", event.created_at);
    cell(row, "type", event.type);
    cell(row, "kind", event.kind);
    jobCell(row, event);
    cell(row, "resource", event.resource || "—");
    empty.remove();
    rows.insertBefore(row, rows.firstChild);
    while (rows.children.length > maxRows) {
      rows.lastElementChild.remove();
    }
  }

  function connect() {
    // A new EventSource has no Last-Event-ID: the server starts it at the
    // feed's end.
    const source = new EventSource(feed.dataset.eventsUrl);
    source.addEventListener("open", function () {
      live.textContent = "live";
    });
    source.addEventListener("feed", function (message) {
      show(JSON.parse(message.data));
    });
    source.addEventListener("restart", function () {
      // The service no longer holds the events after the last row shown: the
      // list starts again from now rather than keep a gap it cannot fill.
      source.close();
      rows.replaceChildren(empty);
      restarted.hidden = false;
      connect();
    });
    source.addEventListener("failure", function (message) {
      // The service refused the stream (e.g. too many open streams).
      live.textContent = "live updates stopped (" + JSON.parse(message.data).code + "): reload the page";
      source.close();
    });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) {
        live.textContent = "disconnected: reload the page";
      } else {
        live.textContent = "reconnecting…";
      }
    });
  }

  connect();
})();
