// Typesets pymdownx.arithmatex's generic output (inline \( \), display \[ \]) with the KaTeX shipped
// beside the site (vendor/katex), on load and on every page change of the theme: no network.
document$.subscribe(() => {
  for (const el of document.querySelectorAll(".arithmatex")) {
    const tex = el.textContent.trim();
    if (el.querySelector(".katex") || !/^\\[[(][\s\S]*\\[\])]$/.test(tex)) continue;
    katex.render(tex.slice(2, -2), el, { displayMode: tex.startsWith("\\["), throwOnError: false });
  }
});
