"""The inline style sheet and script of the HTML report (kept apart from the page's structure).

The script only adds a read-out of the heatmap cell under the mouse; the page reads fully
without it.
"""

from __future__ import annotations

__all__ = ["PAGE_CSS", "PAGE_JS"]

PAGE_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;
padding:0 18px 40px;color:#222;background:#fff}
header{border-bottom:2px solid #eee;margin-bottom:8px}h1{font-size:22px;margin:18px 0 4px}
h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid #eee}h3{font-size:15px;margin:12px 0 4px}
.verdict{font-size:17px;padding:6px 10px;border-radius:6px;display:inline-block}
.verdict.culprit{background:#fde0dc;color:#8b1a10}.verdict.healthy{background:#dff3e4;color:#1e5b2c}
.verdict.inconclusive{background:#fff4ce;color:#6b5200}.verdict.hang{background:#e8dcf5;color:#4b2372}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f6f6f6}td.path{font-size:12px;color:#555}
tr.named td{background:#fdecea;font-weight:bold}tr.off td{background:#fff6e5}
.note{color:#666}svg.figure{max-width:100%;height:auto;display:block;margin:6px 0}
svg text{font:11px system-ui,sans-serif;fill:#333}svg text.axis{font-size:12px;fill:#555}
.irr-mark{fill:#e67e22}.rank-mark{fill:#c0392b}.rank-label{font-weight:bold;fill:#c0392b}
.stage-sep{stroke:#333;stroke-width:1}
.line{fill:none}.line.pivot{stroke:#2c6fbb;stroke-width:1.8}.line.other{stroke:#9ab;stroke-width:1}
.threshold{stroke:#c0392b;stroke-dasharray:6 4}.usual{stroke:#27ae60;stroke-dasharray:2 3}
.irr-point{fill:#fff;stroke:#e67e22;stroke-width:2}.irr-point.explained{fill:#e67e22}
.bar{fill:#d35400}.group{fill:#f4f7fb;stroke:#9db3cf}
.node{fill:#fff;stroke:#999;stroke-width:1}.node.on-path{stroke:#333;stroke-width:2}
.node.pivot{fill:#d6e6fa}.node.culprit{fill:#e74c3c;stroke:#8b1a10}.node-label{font-size:9px}
.edge{fill:none;stroke:#c0392b;opacity:.85}
.switch{fill:#eef1f5;stroke:#7a8aa0}.host{fill:#fafafa;stroke:#999}.gpu{fill:#cfd8e3;stroke:#889}
.switch.named,.host.named,.gpu.named{fill:#e74c3c;stroke:#8b1a10}
.switch.candidate,.host.candidate,.gpu.candidate{fill:#f5b041;stroke:#9a6400}
.cable{stroke:#c9d1db;stroke-width:1}.cable.nic{stroke:#dde3ea}.cable.named{stroke:#e74c3c;stroke-width:3}
.sw-label{font-size:10px}
.key{display:inline-block;width:12px;height:12px;border:1px solid #888;vertical-align:middle;margin:0 3px 0 10px}
.key.named{background:#e74c3c}.key.candidate{background:#f5b041}.key.plain{background:#eef1f5}
"""

PAGE_JS = """
(function(){
  var blob=document.getElementById('heatmap-data'), svg=document.getElementById('heatmap'),
      out=document.getElementById('heatmap-readout');
  if(!blob||!svg||!out){return;}
  var d=JSON.parse(blob.textContent);
  svg.addEventListener('mousemove',function(ev){
    var pt=svg.createSVGPoint(); pt.x=ev.clientX; pt.y=ev.clientY;
    var p=pt.matrixTransform(svg.getScreenCTM().inverse());
    var j=Math.floor((p.x-d.x0)/d.cw), i=Math.floor((p.y-d.y0)/d.ch);
    if(i<0||j<0||i>=d.ranks.length||j>=d.iterations.length){return;}
    var r=d.ranks[i]===d.last[i]?'rank '+d.ranks[i]:'ranks '+d.ranks[i]+'-'+d.last[i];
    var v=d.values[i][j];
    out.textContent=r+' (PP '+d.stage[i]+'), iteration '+d.iterations[j]+': '+
      (v===null?'no data':'compute '+v.toFixed(2)+'x its peers\\'');
  });
})();
"""
