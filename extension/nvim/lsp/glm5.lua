---@brief
---
--- https://github.com/glm5-lsp/glm5-lsp
---
--- `glm5-lsp` gives inline (ghost-text) and list completions, "Fix with GLM-5" and "Generate body"
--- code actions from a GLM-5-architecture model run by its own runtime (or a model served by vLLM,
--- SGLang, llama.cpp or Ollama). It is not on PyPI: install it from a checkout of the repository
--- (`python3 -m pip install -e .` in its root), put this folder on 'runtimepath' (or copy this file
--- to `lsp/glm5.lua` in your config), then:
---
--- ```lua
--- vim.lsp.enable('glm5')
--- vim.lsp.inline_completion.enable() -- Neovim 0.12+
--- vim.keymap.set('i', '<Tab>', function()
---   if not vim.lsp.inline_completion.get() then return '<Tab>' end
--- end, { expr = true, desc = 'Accept the GLM-5 completion' })
--- ```
---
--- Settings go under `settings.glm5` (camelCase, see the project README's settings reference), e.g.
--- a served model (`backend` is `openai`, `llamacpp` or `ollama`; `fim` the infilling layout,
--- `auto` reads it from `name`):
---
--- ```lua
--- vim.lsp.config('glm5', {
---   settings = { glm5 = { model = { backend = 'ollama', name = 'qwen2.5-coder:1.5b-base' } } },
--- })
--- ```

---@type vim.lsp.Config
return {
  cmd = { 'glm5-lsp', 'serve' },
  filetypes = {
    'python',
    'javascript',
    'javascriptreact',
    'typescript',
    'typescriptreact',
    'go',
    'rust',
    'c',
    'cpp',
  },
  root_markers = {
    'pyproject.toml',
    'setup.py',
    'setup.cfg',
    'package.json',
    'tsconfig.json',
    'go.mod',
    'Cargo.toml',
    'compile_commands.json',
    '.git',
  },
  settings = {
    glm5 = {
      completion = { lines = 'auto', debounceMs = 0 },
      features = { inlineCompletion = true, completion = true, codeActions = true },
    },
  },
  -- The server reads the same settings at startup, so the first request already uses them.
  before_init = function(params, config)
    params.initializationOptions = vim.tbl_deep_extend(
      'force',
      (config.settings or {}).glm5 or {},
      params.initializationOptions or {}
    )
  end,
}
