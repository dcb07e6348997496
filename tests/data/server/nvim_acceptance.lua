-- Drives real Neovim (headless) with extension/nvim through the acceptance log's scenario (issue 23):
-- in greet.py an inline suggestion is shown and accepted with <Tab> (Neovim runs the item's command,
-- glm5.accepted); then, lower in the same file, one is shown and typed over (in one buffer: Neovim 0.12's
-- inline completion asks for a buffer it left with the next buffer's cursor). With GLM5_ACCEPTANCE_LOG=on the driver
-- waits until the server's log (GLM5_LOG) holds each outcome; with "off" it waits a moment after each
-- step instead (nothing may be written). Run by tests/test_nvim_gate.py as
-- `nvim --headless --clean -c 'luafile nvim_acceptance.lua'`; environment as nvim_driver.lua's, plus
--   GLM5_GATE  the gate folder the server judges with     GLM5_LOG  where the acceptance log goes
local env = vim.env
local result = { steps = {}, ghost = {} }
local logging = env.GLM5_ACCEPTANCE_LOG == 'on'

local function finish(ok, why)
  result.ok = ok
  result.why = why
  local file = assert(io.open(env.GLM5_RESULT, 'w'))
  file:write(vim.json.encode(result))
  file:close()
  vim.cmd('stopinsert')
  vim.schedule(function()
    vim.cmd(ok and 'qa!' or 'cquit! 3')
  end)
end

local function step(name)
  table.insert(result.steps, name)
end

vim.defer_fn(function()
  finish(false, 'watchdog: the driver did not finish in 100 s')
end, 100000)

vim.opt.runtimepath:prepend(env.GLM5_EXTENSION)
vim.cmd('filetype on')
vim.lsp.config('glm5', {
  cmd = { env.GLM5_PYTHON, '-m', 'glm5_lsp.cli', 'serve' },
  cmd_env = { PYTHONPATH = env.GLM5_REPO, XDG_DATA_HOME = env.XDG_DATA_HOME },
  init_options = {
    model = { backend = 'openai', url = env.GLM5_URL, name = 'scripted' },
    -- a served model's candidates judged by the shipped gate (its log-probability features missing);
    -- minQuality 0: every candidate is shown, so what lands in the buffer is known
    completion = { debounceMs = 0, gatePath = env.GLM5_GATE, minQuality = 0, acceptanceLog = logging },
    budgets = { completionMs = 20000 }, -- behaviour, not latency, is under test (CI may be loaded)
    memory = { enabled = false }, -- not under test here (its first build reads the standard library)
  },
})
vim.lsp.enable('glm5')
vim.lsp.inline_completion.enable()
vim.keymap.set('i', '<Tab>', function()
  if not vim.lsp.inline_completion.get() then
    return '<Tab>'
  end
end, { expr = true })

local function open(name)
  vim.cmd.edit(env.GLM5_WORKDIR .. '/' .. name)
  return vim.wait(30000, function()
    return #vim.lsp.get_clients({ bufnr = 0, name = 'glm5' }) > 0
  end, 50)
end

local function ghost_text()
  local namespace = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  local marks = namespace and vim.api.nvim_buf_get_extmarks(0, namespace, 0, -1, { details = true }) or {}
  if #marks == 0 then
    return nil
  end
  local chunks = marks[1][4].virt_text or {}
  return chunks[1] and chunks[1][1] or ''
end

local function log_has(event)
  local file = io.open(env.GLM5_LOG, 'r')
  if not file then
    return false
  end
  local text = file:read('*a')
  file:close()
  return text:find('"event":"' .. event .. '"', 1, true) ~= nil
end

-- Wait for the outcome to reach the log (or, with the log off, long enough for it to have).
local function settle(event)
  if logging then
    return vim.wait(15000, function()
      return log_has(event)
    end, 50)
  end
  vim.wait(1500, function()
    return false
  end, 50)
  return true
end

-- Poll until ghost text shows, then call `act`; then wait for `event` in the log and call `after`.
local function when_shown(name, act, event, after)
  local deadline = vim.uv.now() + 30000
  local timer = assert(vim.uv.new_timer())
  timer:start(
    100,
    100,
    vim.schedule_wrap(function()
      if vim.uv.now() > deadline then
        timer:stop()
        result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
        return finish(false, 'no ghost text shown in ' .. name)
      end
      local shown = ghost_text()
      if not shown then
        return
      end
      timer:stop()
      result.ghost[name] = shown
      step(name .. ' shown')
      act()
      vim.defer_fn(function()
        if not settle(event) then
          result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
          return finish(false, 'the log never recorded ' .. event .. ' in ' .. name)
        end
        step(name .. ' ' .. event)
        after()
      end, 50)
    end)
  )
end

local function dismiss()
  vim.api.nvim_win_set_cursor(0, { 6, 0 }) -- "fast"
  when_shown('fast', function()
    vim.api.nvim_feedkeys('1', 'nt', false) -- something else than the suggestion: typed over
  end, 'typed_over', function()
    result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    finish(true)
  end)
  vim.api.nvim_feedkeys('A = ', 'ntx!', false)
end

local function accept()
  if not open('greet.py') then
    return finish(false, 'the glm5 client never attached')
  end
  step('attached')
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  when_shown('greet', function()
    vim.api.nvim_feedkeys(vim.keycode('<Tab>'), 'm', false)
  end, 'accepted', function()
    result.greet = vim.api.nvim_buf_get_lines(0, 0, -1, false)[2]
    vim.cmd('stopinsert') -- out of insert mode (once this callback returns), then the next file
    vim.defer_fn(dismiss, 300)
  end)
  vim.api.nvim_feedkeys('A = ', 'ntx!', false)
end

accept()
