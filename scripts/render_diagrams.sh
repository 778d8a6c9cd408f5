#!/usr/bin/env bash
# Render docs/assets/diagrams/*.mmd (mermaid sources) to SVG files next to them, committed and shown
# as plain images: the site needs no JavaScript from a CDN and the diagrams show offline.
# Needs Node.js, Debian's chromium and, once, the npm packages (nothing is added to the repository):
#   npm install --prefix /tmp/mermaid-render mermaid@11 playwright-core
#   MERMAID_NODE_MODULES=/tmp/mermaid-render/node_modules bash scripts/render_diagrams.sh
# Labels are SVG text (htmlLabels off), so the files render anywhere, also outside a browser.
set -euo pipefail
cd "$(dirname "$0")/.."
NM=${MERMAID_NODE_MODULES:?set MERMAID_NODE_MODULES to a node_modules folder holding mermaid and playwright-core}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
NODE_PATH="$NM" node - "$NM/mermaid/dist/mermaid.min.js" "$CHROMIUM" docs/assets/diagrams/*.mmd <<'JS'
const fs = require("fs");
const { chromium } = require("playwright-core");
const [mermaidJs, exe, ...files] = process.argv.slice(2);
(async () => {
  const browser = await chromium.launch({ executablePath: exe, args: ["--no-sandbox", "--disable-gpu",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
  const page = await browser.newPage();
  await page.setContent("<html><body></body></html>");
  await page.addScriptTag({ path: mermaidJs });
  for (const file of files) {
    const src = fs.readFileSync(file, "utf8");
    const svg = await page.evaluate(async (src) => {
      mermaid.initialize({ startOnLoad: false, theme: "neutral", fontFamily: "sans-serif",
        flowchart: { htmlLabels: false }, htmlLabels: false, securityLevel: "strict" });
      const { svg } = await mermaid.render("d" + Math.random().toString(36).slice(2), src);
      return svg;
    }, src);
    const out = file.replace(/\.mmd$/, ".svg");
    fs.writeFileSync(out, svg + "\n");
    console.log(`${out}: ${svg.length} bytes`);
  }
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
JS
