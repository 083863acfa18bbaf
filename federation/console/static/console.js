// gpufed console: live updates over server-sent events. Pages work without it; it only refreshes.
"use strict";
(function () {
  function onReady(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  onReady(function () {
    var table = document.getElementById("jobs");
    if (table && table.dataset.events) {
      var es = new EventSource(table.dataset.events);
      es.addEventListener("job", function (ev) {
        var job = JSON.parse(ev.data);
        var row = table.querySelector('tr[data-job-id="' + CSS.escape(job.job_id) + '"]');
        if (!row) { return; }
        var phase = row.querySelector("td.phase");
        if (phase) { phase.textContent = job.phase; }
        var cluster = row.querySelector("td.cluster");
        if (cluster && job.cluster !== undefined) { cluster.textContent = job.cluster; }
      });
      es.addEventListener("end", function () { es.close(); });
    }
    var phase = document.getElementById("job-phase");
    if (phase && phase.dataset.events) {
      var jes = new EventSource(phase.dataset.events);
      jes.addEventListener("job", function (ev) {
        var job = JSON.parse(ev.data);
        phase.textContent = job.phase;
        var summary = document.getElementById("job-summary");
        if (summary && job.summary !== undefined) { summary.textContent = job.summary; }
        var cancel = document.getElementById("cancel");
        if (cancel && job.terminal) { cancel.hidden = true; }
      });
      jes.addEventListener("end", function () { jes.close(); });
    }
    var out = document.getElementById("log-output");
    if (out && out.dataset.events) {
      var follow = document.getElementById("log-follow");
      var les = null;
      var stop = function () { if (les) { les.close(); les = null; } };
      // The tail of the log, then (when following) what comes after it, until the job ends.
      var start = function (following) {
        stop();
        out.textContent = "";
        les = new EventSource(out.dataset.events + "?follow=" + (following ? "1" : "0"));
        les.addEventListener("log", function (ev) {
          var note = document.getElementById("log-notice");
          if (note && note.dataset.waiting) { note.textContent = ""; delete note.dataset.waiting; }
          var atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
          out.appendChild(document.createTextNode(JSON.parse(ev.data)));
          if (atEnd) { out.scrollTop = out.scrollHeight; }
        });
        les.addEventListener("notice", function (ev) {
          var note = document.getElementById("log-notice");
          if (note) { note.textContent = JSON.parse(ev.data); note.dataset.waiting = "1"; }
        });
        les.addEventListener("end", function (ev) {
          stop();
          var data = ev.data ? JSON.parse(ev.data) : {};
          var note = document.getElementById("log-notice");
          if (note && data.message) { note.textContent = data.message; }
        });
      };
      start(follow ? follow.checked : false);
      if (follow) {
        follow.addEventListener("change", function () { if (follow.checked) { start(true); } else { stop(); } });
      }
    }
  });
})();
