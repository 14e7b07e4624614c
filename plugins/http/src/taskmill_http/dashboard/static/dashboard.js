// taskmill dashboard: live updates over Server-Sent Events, local times, keyboard moves.
// Hand-written, no build step. Everything it shows is set with textContent (never HTML),
// but for a refreshed section, which is the server's own escaped page.
"use strict";
(() => {
  const body = document.body;

  // Times render in the browser's time zone; the ISO value stays in the title.
  const localTimes = (root) => {
    for (const el of root.querySelectorAll("time[datetime]")) {
      const when = new Date(el.dateTime);
      if (!Number.isNaN(when.getTime())) {
        el.textContent = when.toLocaleString();
        el.title = el.dateTime;
      }
    }
    // A chart's time labels (SVG text, drawn in UTC on the server): the local clock.
    let local = false;
    for (const el of root.querySelectorAll("svg text[data-time]")) {
      const when = new Date(el.dataset.time);
      if (!Number.isNaN(when.getTime())) {
        el.textContent = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
        local = true;
      }
    }
    if (local) {
      for (const el of root.querySelectorAll("svg text[data-zone]")) el.textContent = "local time";
    }
  };
  localTimes(document);

  // Keyboard: "/" focuses the search; j and k move between the rows of a task table.
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target.closest && event.target.closest("input, textarea, select")) return;
    if (event.key === "/") {
      const search = document.getElementById("f-q");
      if (search) {
        event.preventDefault();
        search.focus();
      }
    } else if (event.key === "j" || event.key === "k") {
      const links = [...document.querySelectorAll("tr[data-task-id] td[data-label=Task] a")];
      if (!links.length) return;
      const at = links.indexOf(document.activeElement);
      const next = event.key === "j" ? Math.min(at + 1, links.length - 1) : Math.max(at - 1, 0);
      links[at < 0 ? 0 : next].focus();
    }
  });

  // A section with data-refresh="SECONDS" (the workers page: heartbeats are no events)
  // is fetched again that often and swapped in place; the page itself is not reloaded.
  // The new section is parsed by DOMParser (no script runs) from this same page.
  const refreshing = document.querySelector("[data-refresh][id]");
  if (refreshing) {
    const every = Math.max(1, Number(refreshing.dataset.refresh) || 5) * 1000;
    let refreshes = 0;
    const refresh = async () => {
      try {
        const answer = await fetch(window.location.href, {
          credentials: "same-origin",
          headers: { Accept: "text/html" },
        });
        if (answer.ok && answer.headers.get("content-type").startsWith("text/html")) {
          const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
          const section = fresh.getElementById(refreshing.id);
          const current = document.getElementById(refreshing.id);
          if (section && current) {
            localTimes(section);
            current.replaceWith(document.adoptNode(section));
            refreshes += 1;
            body.dataset.refreshes = String(refreshes);
          }
        }
      } catch (error) {
        // offline for a moment: the next round tries again
      }
      setTimeout(refresh, every);
    };
    setTimeout(refresh, every);
  }

  // "Cancel N selected": the button counts the checked rows (the server counts again,
  // children and aliases included, on its confirmation page).
  const cancelSelected = document.getElementById("cancel-selected");
  if (cancelSelected) {
    const count = () => {
      const checked = document.querySelectorAll("input[data-select]:checked").length;
      cancelSelected.querySelector("[data-selected-count]").textContent = String(checked);
      cancelSelected.disabled = checked === 0;
    };
    document.addEventListener("change", (event) => {
      if (event.target.matches && event.target.matches("input[data-select]")) count();
    });
    count();
  }

  const url = body.dataset.events;
  if (!url || !window.EventSource) return;
  const live = document.getElementById("live");
  const setLive = (state, text) => {
    body.dataset.live = state;
    if (live) {
      live.hidden = false;
      live.textContent = text;
    }
  };

  const pct = (progress) =>
    progress && progress.total
      ? Math.max(0, Math.min(100, (100 * progress.done) / progress.total))
      : null;

  const paint = (scope, status, progress) => {
    const badge = scope.querySelector("[data-status]");
    if (badge && status) {
      badge.textContent = status;
      badge.className = `status status-${status}`;
    }
    const bar = scope.querySelector("[data-progress]");
    if (bar && progress) {
      // A completed task is done, whatever its last coalesced progress write said.
      const share = status === "completed" ? 100 : pct(progress);
      const meter = bar.querySelector("progress");
      meter.value = share === null ? 0 : share;
      meter.textContent = `${Math.round(share || 0)}%`;
      bar.querySelector("[data-pct]").textContent =
        share === null ? (progress.done ? `${progress.done} done` : "") : `${Math.round(share)}%`;
      bar.querySelector("[data-message]").textContent = progress.message || "";
    }
  };

  // Updates are coalesced: the newest event per task, painted at most every 100 ms, so a
  // thousand events a second cost ten repaints.
  const tasks = new Map();
  const jobs = new Map();
  const unseen = new Set();
  let seen = 0;
  let timer = 0;
  const flush = () => {
    timer = 0;
    for (const [id, event] of tasks) {
      const scopes = document.querySelectorAll(`[data-task-id="${CSS.escape(id)}"]`);
      if (!scopes.length && event.kind === "enqueued") unseen.add(id);
      for (const scope of scopes) {
        paint(scope, event.task.status, event.task.progress);
        if (scope.tagName === "TR") {
          scope.classList.remove("updated");
          void scope.offsetWidth; // restart the highlight
          scope.classList.add("updated");
        } else if (event.kind !== "progress") {
          const changed = scope.querySelector("[data-changed]");
          if (changed) changed.hidden = false;
        }
      }
    }
    tasks.clear();
    for (const [key, job] of jobs) {
      for (const row of document.querySelectorAll("tr[data-job-id]")) {
        if (`${row.dataset.jobApp}\u0000${row.dataset.jobId}` === key) {
          paint(row, job.status, job.progress);
        }
      }
    }
    jobs.clear();
    const notice = document.getElementById("new-tasks");
    if (notice && unseen.size) {
      notice.hidden = false;
      notice.querySelector("[data-new-count]").textContent = String(unseen.size);
    }
    body.dataset.eventsSeen = String(seen);
  };
  const schedule = () => {
    if (!timer) timer = setTimeout(flush, 100);
  };

  // EventSource reconnects by itself and sends Last-Event-ID: the service resumes the
  // stream from there without a gap (an overflow ends a stream the same way).
  const source = new EventSource(url);
  source.addEventListener("ready", () => setLive("open", "live"));
  source.addEventListener("job_update", (message) => {
    const event = JSON.parse(message.data);
    seen += 1;
    tasks.set(event.task.id, event);
    schedule();
  });
  source.addEventListener("external_job_update", (message) => {
    const job = JSON.parse(message.data);
    seen += 1;
    jobs.set(`${job.app_id || ""}\u0000${job.job_id}`, job);
    schedule();
  });
  source.addEventListener("overflow", () => setLive("behind", "catching up…"));
  source.addEventListener("error", () => setLive("reconnecting", "reconnecting…"));
})();
