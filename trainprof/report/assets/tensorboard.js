// trainprof's TensorBoard tab (an ES module TensorBoard loads into an iframe and calls render()):
// a run picker over ./runs and the chosen run's report.html in an iframe. Names reach the page
// as text only. Served by trainprof/report/tensorboard_plugin.py; nothing comes from the network.
export async function render() {
  const style = document.createElement("style");
  style.textContent = [
    "body { margin: 0; font: 14px system-ui, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif; color: #1d2330; }",
    ".bar { display: flex; gap: 10px; align-items: center; padding: 8px 12px; border-bottom: 1px solid #dfe3ea; }",
    ".bar select { font: inherit; padding: 2px 6px; max-width: 70vw; }",
    ".bar .note { color: #5b6475; font-size: 13px; }",
    "iframe { display: block; width: 100%; height: calc(100vh - 44px); border: 0; }",
  ].join("\n");
  document.head.appendChild(style);

  const bar = document.createElement("div");
  bar.className = "bar";
  const title = document.createElement("b");
  title.textContent = "trainprof";
  const picker = document.createElement("select");
  picker.setAttribute("aria-label", "run");
  const note = document.createElement("span");
  note.className = "note";
  bar.append(title, picker, note);
  const frame = document.createElement("iframe");
  frame.title = "trainprof report";
  // The report runs its script in an opaque origin: no reach into TensorBoard's pages or data.
  frame.setAttribute("sandbox", "allow-scripts");
  document.body.append(bar, frame);

  let runs = [];
  try {
    const response = await fetch("./runs");
    runs = response.ok ? await response.json() : [];
  } catch (error) {
    note.textContent = "cannot list the runs: " + error;
    return;
  }
  if (!runs.length) {
    note.textContent = "No trainprof run under --logdir (a run folder holds report.html or trace files).";
    picker.hidden = true;
    return;
  }
  // The runs come newest first, a run's ranks together: those in one group named by the run.
  let group = null;
  runs.forEach((run, index) => {
    const option = document.createElement("option");
    option.value = String(index);
    const ranked = run.rank !== null && run.rank !== undefined;
    if (ranked && (!group || group.label !== run.run)) {
      group = document.createElement("optgroup");
      group.label = run.run;
      picker.appendChild(group);
    } else if (!ranked) {
      group = null;
    }
    option.textContent = (ranked ? "rank " + run.rank : run.label) + (run.file ? "" : " (analysed now)");
    (ranked ? group : picker).appendChild(option);
  });
  const show = () => {
    const run = runs[Number(picker.value)];
    const query = new URLSearchParams({ run: run.run });
    if (run.file) query.set("file", run.file);
    frame.src = "./report?" + query.toString();
  };
  picker.addEventListener("change", show);
  const count = new Set(runs.map((run) => run.run)).size;
  note.textContent = count + " run" + (count === 1 ? "" : "s") + " under --logdir, the newest first";
  picker.value = "0";  // the newest run (its rank 0 under a launcher)
  show();
}
