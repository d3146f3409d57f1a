"""The report's inline stylesheet and script (:mod:`agentgym.app.report` writes them into each file, so
a report opens offline and fetches nothing). Data, not logic: the colours of token kinds, the newline
and tab markers, and the hover box that shows a token's id and log-prob."""

CSS = """
:root{--pol:#cfe8d4;--pol-b:#1f7a3a;--env:#ffe3b8;--env-b:#a15c00;--prompt:#e8e8ee;--prompt-b:#666;
--sp:#5b2a86;--bad:#d0021b;--tmpl:#ece4f5;--tmpl-b:#6b4f8a;--retr:#d6e9fb;--retr-b:#1d5f9e;--other:#fbf3c4;
--other-b:#7a6500}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif;margin:0;
background:#f6f7f9;color:#1d1d1f}
header{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid #ddd;padding:10px 18px}
header h1{font-size:18px;margin:0 0 6px}
.controls{display:flex;gap:14px;align-items:center;flex-wrap:wrap;font-size:13px}
.legend span{padding:1px 6px;border-radius:3px;margin-right:4px}
main{padding:12px 18px}
table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #ddd;padding:2px 7px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f0f1f4;text-align:left;font-weight:600}
#metrics{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;margin:4px 0 12px}
.card{background:#fff;border:1px solid #d8d8de;border-left:6px solid #2e9d4e;border-radius:6px;
padding:8px 14px;margin:0 0 14px}
.card.fail{border-left-color:#d0021b}
.card h2{font-size:15px;margin:2px 0 4px}
.badge{font-size:12px;padding:1px 7px;border-radius:10px;color:#fff;background:#2e9d4e}
.badge.fail{background:#d0021b}
.task{color:#444;margin:0 0 4px;white-space:pre-wrap}
.facts{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12.5px;margin-bottom:4px}
.fact .k{color:#777}.fact .v{font-weight:600}
.warn{background:#fde8ea;color:#9b0015;border:1px solid #f5b5bd;padding:3px 8px;margin:4px 0;border-radius:4px}
summary{cursor:pointer;color:#555;font-size:12.5px;margin:4px 0}
.rw td.pos{color:#1f7a3a}.rw td.neg{color:#b00020}.rw td.z{color:#999}.rw td.sr{font-weight:600}
.rw tr.total td,.rw tr.total th{border-top:2px solid #aaa}
.muted{color:#888}
.scroll{max-height:260px;overflow:auto;display:inline-block}
.tokens{font:12.5px/1.75 "DejaVu Sans Mono",Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all;
border:1px solid #e2e2e8;border-radius:4px;padding:6px 8px;background:#fcfcfd}
.run i{font-style:normal;border-radius:2px}
.run.prompt{background:var(--prompt);color:#444}
.run.env{background:var(--env);color:#3d2600}
.run.pol{background:var(--pol);color:#0c3318;box-shadow:inset 0 -2px 0 var(--pol-b)}
.run.env.k-template{background:var(--tmpl);color:#3a2a4d}
.run.env.k-retrieved{background:var(--retr);color:#0d2f52}
.run.env.k-env{background:var(--other);color:#3d3300}
.run.prompt i:nth-child(even){background:#dcdce4}
.run.env i:nth-child(even){background:#fbd49c}
.run.env.k-template i:nth-child(even){background:#e0d3ee}
.run.env.k-retrieved i:nth-child(even){background:#bcdaf7}
.run.env.k-env i:nth-child(even){background:#f5e79a}
.run.pol i:nth-child(even){background:#b5dcbf}
.run i.sp{color:#fff;background:var(--sp)!important;font-weight:600;padding:0 2px;border-radius:3px}
.run i.mb{text-decoration:underline dotted #555}
.run.pol i.lo{text-decoration:underline wavy #c0392b}
.run.bad{outline:2px solid var(--bad);outline-offset:-1px}
.run[data-r]::after{content:"r=" attr(data-r);font:10px system-ui,sans-serif;color:#fff;background:#333;
border-radius:3px;padding:0 3px;margin-left:2px;vertical-align:super}
b.nl::before{content:"\\21B5";color:#9a9aa8;font-weight:400}
b.tab::before{content:"\\2192";color:#9a9aa8;font-weight:400}
b.cr::before{content:"\\240D";color:#9a9aa8;font-weight:400}
b.ctl{color:#b00020;font-weight:400}
body.hide-prompt .run.prompt{display:none}
body.failed-only .card.ok{display:none}
.messages .msg{border-left:4px solid #999;padding:3px 8px;margin:4px 0;border-radius:3px}
.msg .role{font-size:11.5px;font-weight:700;text-transform:uppercase;color:#555}
.msg .content{white-space:pre-wrap;font:12.5px/1.5 "DejaVu Sans Mono",Menlo,Consolas,monospace}
.msg.pol{background:var(--pol);border-color:var(--pol-b)}.msg.env{background:var(--env);border-color:var(--env-b)}
.msg.prompt{background:var(--prompt);border-color:var(--prompt-b)}
span.pol{color:var(--pol-b)}span.env{color:var(--env-b)}span.prompt{color:var(--prompt-b)}
span.k-template{color:var(--tmpl-b)}span.k-tool{color:var(--env-b)}span.k-retrieved{color:var(--retr-b)}
span.k-env{color:var(--other-b)}
#tip{position:fixed;z-index:10;display:none;pointer-events:none;background:#222;color:#fff;font:12px/1.4 monospace;
padding:4px 7px;border-radius:4px;max-width:520px;white-space:pre-wrap}
"""

JS = r"""
(function(){
  var body = document.body, tip = document.getElementById('tip');
  var cards = Array.prototype.slice.call(document.querySelectorAll('section.card'));
  var counter = document.getElementById('counter');
  function update(){
    var failedOnly = document.getElementById('failed-only').checked;
    body.classList.toggle('failed-only', failedOnly);
    body.classList.toggle('hide-prompt', document.getElementById('hide-prompt').checked);
    var shown = cards.filter(function(c){ return !failedOnly || c.dataset.success !== '1'; }).length;
    var failed = cards.filter(function(c){ return c.dataset.success !== '1'; }).length;
    counter.textContent = 'showing ' + shown + ' of ' + cards.length + ' trajectories (' + failed + ' failed)';
  }
  document.getElementById('failed-only').addEventListener('change', update);
  document.getElementById('hide-prompt').addEventListener('change', update);
  // Token info from the run's data attributes: pieces are comma-separated, tokens of one piece '+'-joined.
  function info(el){
    var run = el.parentNode;
    if (!run || !run.classList || !run.classList.contains('run') || !run.dataset.ids) return null;
    var idx = Array.prototype.indexOf.call(run.children, el);
    var ids = run.dataset.ids.split(',')[idx].split('+');
    var pos = parseInt(run.dataset.start, 10);
    var pieces = run.dataset.ids.split(',');
    for (var k = 0; k < idx; k++) pos += pieces[k].split('+').length;
    var kind = run.classList.contains('pol') ? 'policy'
      : (run.classList.contains('env') ? (run.dataset.kind || 'environment') : 'prompt');
    var lines = [JSON.stringify(el.textContent)];
    var lps = run.dataset.lp ? run.dataset.lp.split(',')[idx].split('+') : null;
    ids.forEach(function(id, j){
      var s = 'token #' + (pos + j) + '  id ' + id + '  ' + kind;
      if (run.classList.contains('bad')) s += ' (MASK MISMATCH)';
      if (lps) { var lp = parseFloat(lps[j]); s += '  logprob ' + lp.toFixed(4) + '  p=' + Math.exp(lp).toFixed(3); }
      lines.push(s);
    });
    if (run.dataset.turn !== undefined) lines.push((kind === 'policy' ? 'turn ' : 'after turn ') + run.dataset.turn);
    if (run.classList.contains('env')) lines.push('environment token (loss_mask 0)');
    if (el.classList.contains('mb')) lines.push('(tokens joined: together they form one character)');
    return lines.join('\n');
  }
  document.addEventListener('mouseover', function(e){
    var t = e.target.closest ? e.target.closest('.run > i') : null;
    var text = t ? info(t) : null;
    if (!text) { tip.style.display = 'none'; return; }
    tip.textContent = text; tip.style.display = 'block';
  });
  document.addEventListener('mousemove', function(e){
    if (tip.style.display === 'none') return;
    var x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 10 : e.clientY + 18;
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  });
  if (/(^|[#&])failed($|&)/.test(location.hash)) document.getElementById('failed-only').checked = true;
  update();
  // '#selftest' (used by the tests through headless Chromium): hover the first policy token (and the first
  // tool-output token) and keep the tooltips.
  if (/selftest/.test(location.hash)) {
    var first = document.querySelector('.run.pol > i');
    var out = document.createElement('pre'); out.id = 'selftest';
    out.textContent = first ? info(first) : 'no policy token';
    body.appendChild(out);
    var tool = document.querySelector('.run.env.k-tool > i');
    var outTool = document.createElement('pre'); outTool.id = 'selftest-tool';
    outTool.textContent = tool ? info(tool) : 'no tool token';
    body.appendChild(outTool);
  }
  body.dataset.ready = '1';
})();
"""

