// calor ui: sortable tables, and the events page's live feed.
"use strict";

function sortTable(table, column, kind, descending) {
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const key = (row) => {
    const cell = row.cells[column];
    const raw = cell.dataset.value ?? cell.textContent.trim();
    return kind === "number" ? parseFloat(raw) || 0 : raw.toLowerCase();
  };
  rows.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (descending ? -1 : 1));
  rows.forEach((row) => body.appendChild(row));
}

document.querySelectorAll("table.sortable").forEach((table) => {
  table.querySelectorAll("th[data-sort]").forEach((th, column) => {
    th.addEventListener("click", () => {
      const descending = th.dataset.order !== "desc";
      th.dataset.order = descending ? "desc" : "asc";
      sortTable(table, column, th.dataset.sort, descending);
    });
  });
});

function calorEvents(streamUrl) {
  const form = document.getElementById("event-filter");
  const state = document.getElementById("stream-state");
  const body = document.querySelector("#events tbody");
  let source = null;
  const open = () => {
    if (source) source.close();
    const query = new URLSearchParams(new FormData(form));
    source = new EventSource(streamUrl + "?" + query.toString());
    state.textContent = "connecting…";
    source.addEventListener("ready", () => { state.textContent = "live"; });
    source.addEventListener("memory-event", (message) => {
      const event = JSON.parse(message.data);
      const row = body.insertRow(0);
      row.className = "fresh";
      row.dataset.kind = event.kind;
      row.dataset.memory = event.memory_id;
      for (const value of [event.seq, event.at, event.kind, event.channel, event.memory_id, event.message]) {
        row.insertCell().textContent = value;
      }
      while (body.rows.length > 500) body.deleteRow(-1);
    });
    source.onerror = () => { state.textContent = "reconnecting…"; };
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); open(); });
  open();
}
