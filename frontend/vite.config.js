// builds src/ into one script and one stylesheet: ../msprobe/view/static/app.js, app.css
// (one file each, so msprobe report can inline them into a self-contained page)
import { defineConfig } from "vite";

export default defineConfig({
  define: { "process.env.NODE_ENV": JSON.stringify("production") },
  build: {
    outDir: "../msprobe/view/static",
    emptyOutDir: false,
    cssCodeSplit: false,
    sourcemap: false,
    lib: { entry: "src/main.js", name: "msprobeView", formats: ["iife"], fileName: () => "app.js", cssFileName: "app" },
    rollupOptions: { output: { assetFileNames: "app[extname]" } },
  },
});
