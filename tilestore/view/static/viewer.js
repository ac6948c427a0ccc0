// tilestore view: the slides served, their overlays and a similarity search, over
// OpenSeadragon. Everything comes from the server's read-only GET routes (server.py).
"use strict";

const $ = (id) => document.getElementById(id);
const LAYERS = ["tissue", "qc", "roi", "plan", "tiles"];  // drawn in this order, bottom up
const TITLES = { tissue: "Tissue", qc: "QC artefacts", roi: "ROIs", plan: "Plan", tiles: "Tiles" };
const state = {
  slides: [], slide: null, viewer: null, tilesLoaded: 0,
  layers: {},  // key -> {item, facts}
  hits: null, marker: null, columnsReady: Promise.resolve(),
};
window.tilestore = state;  // for the browser tests and the curious

async function api(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function status(text) { $("status").textContent = text || ""; }

// A store's pyramid as OpenSeadragon levels: its level i is OpenSeadragon's n-1-i, at the
// store's own downsample (levels need not halve), tiles of the store's chunk size. Edge
// chunks are whole chunks; OpenSeadragon draws only the part inside the level.
function tileSource(slide) {
  const n = slide.levels.length;
  const level = (l) => slide.levels[n - 1 - l];
  return {
    width: slide.width, height: slide.height,
    tileWidth: slide.levels[0].tile[1], tileHeight: slide.levels[0].tile[0], tileOverlap: 0,
    minLevel: 0, maxLevel: n - 1,
    getLevelScale: (l) => 1 / level(l).downsample[1],
    getNumTiles: (l) => new OpenSeadragon.Point(
      Math.ceil(level(l).width / level(l).tile[1]), Math.ceil(level(l).height / level(l).tile[0])),
    getTileWidth: (l) => level(l).tile[1],
    getTileHeight: (l) => level(l).tile[0],
    getTileUrl: (l, x, y) => `/tiles/${slide.id}/${n - 1 - l}/${x}/${y}`,
  };
}

function makeViewer() {
  const viewer = OpenSeadragon({
    id: "viewer", drawer: "canvas", showNavigationControl: false, showNavigator: true,
    navigatorPosition: "TOP_RIGHT", maxZoomPixelRatio: 2, visibilityRatio: 0.5,
    gestureSettingsMouse: { clickToZoom: false }, crossOriginPolicy: false,
  });
  viewer.addHandler("tile-loaded", (e) => { if (e.tiledImage === viewer.world.getItemAt(0)) state.tilesLoaded++; });
  viewer.addHandler("canvas-click", onClick);
  return viewer;
}

// -- slides --------------------------------------------------------------------------------

function listSlides() {
  const list = $("slides");
  list.innerHTML = "";
  for (const slide of state.slides) {
    const item = document.createElement("li");
    item.textContent = slide.name;
    item.title = slide.path;
    item.dataset.id = slide.id;
    item.onclick = () => openSlide(slide.id);
    list.appendChild(item);
  }
}

function openSlide(id, then) {
  const slide = state.slides[id];
  state.slide = slide;
  state.layers = {};
  for (const li of $("slides").children) li.classList.toggle("current", Number(li.dataset.id) === id);
  state.viewer.addOnceHandler("open", () => { refreshLayers(); if (then) then(); });
  state.viewer.open(tileSource(slide));
  fillLayerControls(slide);
  showFacts(slide);
}

function fillLayerControls(slide) {
  const L = slide.layers;
  for (const key of ["tissue", "qc", "roi"]) {
    $(`show-${key}`).disabled = !L[key];
    document.querySelector(`[data-layer="${key}"]`).classList.toggle("unavailable", !L[key]);
  }
  document.querySelector('[data-layer="plan"]').classList.toggle("unavailable", !L.plans.length);
  $("show-plan").disabled = !L.plans.length;
  fillSelect($("plan"), L.plans);
  const models = Object.keys(L.models);
  $("show-tiles").disabled = !models.length;
  document.querySelector('[data-layer="tiles"]').classList.toggle("unavailable", !models.length);
  const kept = $("model").value;
  fillSelect($("model"), models);
  if (models.includes(kept)) $("model").value = kept;
  state.columnsReady = fillColumns();  // the tiles layer waits for it
}

function fillSelect(select, values) {
  select.innerHTML = "";
  for (const value of values) {
    const option = document.createElement("option");
    option.value = option.textContent = value;
    select.appendChild(option);
  }
}

async function fillColumns() {
  const model = $("model").value;
  if (!model) { fillSelect($("column"), []); return; }
  const kept = $("column").value;
  const found = await api(`/api/columns?model=${encodeURIComponent(model)}`);
  fillSelect($("column"), found.columns);
  $("column").value = found.columns.includes(kept) ? kept : "pca";
  columnControls();
  if (state.slide) showFacts(state.slide);
}

function columnControls() {
  const column = $("column").value;
  $("k-box").hidden = column !== "clusters";
  $("scope-box").hidden = column !== "similarity";
  $("click-hint").hidden = column !== "similarity";
}

function showFacts(slide) {
  const facts = [
    ["name", slide.name], ["path", slide.path],
    ["size", `${slide.width} x ${slide.height} px`],
    ["pixel size", slide.mpp ? `${slide.mpp[0].toPrecision(4)} um/px` : "unknown"],
    ["levels", slide.levels.map((l) => `${l.width}x${l.height}`).join(", ")],
    ["format", slide.facts.format], ["vendor", slide.facts.vendor],
    ["in place", slide.facts["in place"] ? "yes" : "no"],
  ];
  if (slide.facts.qc && slide.facts.qc.flagged !== undefined) facts.push(["QC flagged", String(slide.facts.qc.flagged)]);
  const model = $("model").value;
  const run = slide.layers.models[model];
  if (run) {
    facts.push(["model", model], ["dim", run.dim], ["pooling", run.pooling], ["precision", run.precision],
               ["plan", run.plan], ["tiles", run.tiles], ["embedded", run.finished]);
  }
  const list = $("facts");
  list.innerHTML = "";
  for (const [key, value] of facts) {
    if (value === undefined || value === null || value === "") continue;
    const dt = document.createElement("dt"); dt.textContent = key;
    const dd = document.createElement("dd"); dd.textContent = value;
    list.append(dt, dd);
  }
}

// -- overlays ------------------------------------------------------------------------------

function layerParams(key) {
  if (key === "tissue" || key === "qc" || key === "roi") return { kind: key };
  if (key === "plan") return { kind: "plan", plan: $("plan").value };
  const params = { kind: "tiles", model: $("model").value, column: $("column").value };
  if (params.column === "clusters") params.k = $("k").value;
  if (params.column === "similarity") {
    if (!state.hits) return null;  // waits for a click
    params.ref = state.hits.ref.tile;
  }
  return params;
}

function opacity(key) { return Number(document.querySelector(`.opacity[data-for="${key}"]`).value) / 100; }

function removeLayer(key) {
  const layer = state.layers[key];
  if (layer && layer.item) state.viewer.world.removeItem(layer.item);
  delete state.layers[key];
}

async function showLayer(key) {
  const slide = state.slide;
  if (key === "tiles") await state.columnsReady;  // a model's columns still on their way
  const params = layerParams(key);
  if (!params) { removeLayer(key); drawLegend(); return; }
  const facts = await api(`/api/overlay/${slide.id}?${new URLSearchParams(params)}`);
  if (slide !== state.slide) return;
  removeLayer(key);
  const layer = { item: null, facts };
  state.layers[key] = layer;
  const below = LAYERS.slice(0, LAYERS.indexOf(key)).filter((k) => state.layers[k] && state.layers[k].item);
  state.viewer.addTiledImage({
    tileSource: { type: "image", url: facts.url, buildPyramid: false },
    index: 1 + below.length,  // above the slide and the overlays listed before it
    x: 0, y: 0, width: facts.extent[0] / slide.width, opacity: opacity(key),
    success: (e) => { if (state.layers[key] === layer) layer.item = e.item; else state.viewer.world.removeItem(e.item); },
  });
  drawLegend();
}

async function refreshLayer(key) {
  try {
    status("");
    if ($(`show-${key}`).checked && !$(`show-${key}`).disabled) await showLayer(key);
    else { removeLayer(key); drawLegend(); }
  } catch (error) { status(`${key}: ${error.message}`); removeLayer(key); drawLegend(); }
}

async function refreshLayers() { for (const key of LAYERS) await refreshLayer(key); }

function drawLegend() {
  const box = $("legend");
  box.innerHTML = "";
  for (const key of LAYERS) {
    const layer = state.layers[key];
    if (!layer) continue;
    const legend = layer.facts.legend;
    const entry = document.createElement("div");
    entry.className = "entry";
    entry.dataset.layer = key;
    const title = document.createElement("div");
    title.className = "title";
    title.textContent = legend.label || TITLES[key];
    entry.appendChild(title);
    if (legend.kind === "classes") {
      for (const item of legend.items) {
        const row = document.createElement("div");
        row.className = "item";
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = `rgba(${item.rgba[0]},${item.rgba[1]},${item.rgba[2]},${Math.max(item.rgba[3], 90) / 255})`;
        const text = document.createElement("span");
        text.textContent = `${item.name}: ${item.count} (${(100 * item.share).toFixed(1)}%)`;
        row.append(swatch, text);
        entry.appendChild(row);
      }
    } else if (legend.kind === "scale") {
      const bar = document.createElement("div");
      bar.className = "bar";
      bar.style.background = `linear-gradient(to right, ${legend.stops.join(",")})`;
      const range = document.createElement("div");
      range.className = "range";
      range.innerHTML = `<span>${legend.min.toPrecision(3)}</span><span>${legend.max.toPrecision(3)}</span>`;
      entry.append(bar, range);
    }
    if (legend.note) {
      const note = document.createElement("div");
      note.className = "note";
      note.textContent = legend.note;
      entry.appendChild(note);
    }
    box.appendChild(entry);
  }
}

// -- similarity ----------------------------------------------------------------------------

async function onClick(event) {
  if (!event.quick || $("column").value !== "similarity" || !$("show-tiles").checked) return;
  event.preventDefaultAction = true;
  const slide = state.slide;
  const base = state.viewer.world.getItemAt(0);
  const point = base.viewerElementToImageCoordinates(event.position);
  const params = new URLSearchParams({ model: $("model").value, x: point.x, y: point.y, k: 12, scope: $("scope").value });
  try {
    status("");
    state.hits = await api(`/api/similar/${slide.id}?${params}`);
  } catch (error) { status(error.message); return; }
  markTile(state.hits.ref);
  showGallery(state.hits);
  await refreshLayer("tiles");
}

function markTile(tile) {
  if (state.marker) state.viewer.removeOverlay(state.marker);
  state.marker = null;
  if (!state.slide || tile.slide !== state.slide.id) return;
  const element = document.createElement("div");
  element.className = "marker";
  const rect = state.viewer.world.getItemAt(0).imageToViewportRectangle(tile.x, tile.y, tile.size[1], tile.size[0]);
  state.viewer.addOverlay({ element, location: rect });
  state.marker = element;
}

function showGallery(found) {
  $("gallery").hidden = false;
  $("gallery-ref").textContent = `like tile ${found.ref.tile} of ${found.ref.name}`;
  const box = $("hits");
  box.innerHTML = "";
  for (const hit of found.hits) {
    const item = document.createElement("div");
    item.className = "hit";
    item.title = `${hit.name}, tile ${hit.tile} at (${hit.x}, ${hit.y})`;
    const image = document.createElement("img");
    image.src = hit.thumb;
    image.alt = `tile ${hit.tile}`;
    const caption = document.createElement("div");
    caption.textContent = `${hit.score.toFixed(3)} ${hit.slide === state.slide.id ? "" : hit.name}`;
    item.append(image, caption);
    item.onclick = () => goTo(hit);
    box.appendChild(item);
  }
}

function goTo(tile) {
  const show = () => {
    const rect = state.viewer.world.getItemAt(0).imageToViewportRectangle(
      tile.x - tile.size[1], tile.y - tile.size[0], 3 * tile.size[1], 3 * tile.size[0]);
    state.viewer.viewport.fitBounds(rect);
    markTile(tile);
  };
  if (tile.slide !== state.slide.id) openSlide(tile.slide, show); else show();
}

// -- start ---------------------------------------------------------------------------------

async function start() {
  state.viewer = makeViewer();
  state.slides = await api("/api/slides");
  listSlides();
  for (const key of LAYERS) {
    $(`show-${key}`).onchange = () => refreshLayer(key);
    document.querySelector(`.opacity[data-for="${key}"]`).oninput = () => {
      const layer = state.layers[key];
      if (layer && layer.item) layer.item.setOpacity(opacity(key));
    };
  }
  $("plan").onchange = () => refreshLayer("plan");
  $("model").onchange = async () => {
    state.hits = null;
    state.columnsReady = fillColumns();
    await state.columnsReady;
    refreshLayer("tiles");
  };
  $("column").onchange = () => { columnControls(); refreshLayer("tiles"); };
  $("k").onchange = () => refreshLayer("tiles");
  $("gallery-close").onclick = () => { $("gallery").hidden = true; };
  openSlide(0);
}

start().catch((error) => status(error.message));
