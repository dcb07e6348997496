-- Drives real Neovim (headless) with extension/nvim through one scenario (GLM5_SCENARIO):
--   "fix":    a "Fix with GLM-5" code action on fix.py, which has a syntax error;
--   "inline": typing in insert mode in greet.py, receiving ghost text and accepting it with <Tab>.
-- Run by tests/test_nvim_client.py as `nvim --headless --clean -c 'luafile nvim_driver.lua'`; environment:
--   GLM5_EXTENSION  the extension/nvim folder        GLM5_PYTHON  the Python to start the server with
--   GLM5_REPO       the repository (PYTHONPATH)       GLM5_URL     the scripted OpenAI-compatible server
--   GLM5_WORKDIR    a folder with fix.py and greet.py GLM5_RESULT  where to write the JSON result
local env = vim.env
local result = { steps = {} }

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

-- Whatever happens, Neovim ends within 90 s with what it saw.
vim.defer_fn(function()
  result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  finish(false, 'watchdog: the driver did not finish in 90 s')
end, 90000)

vim.opt.runtimepath:prepend(env.GLM5_EXTENSION)
vim.cmd('filetype on')
vim.lsp.config('glm5', {
  cmd = { env.GLM5_PYTHON, '-m', 'glm5_lsp.cli', 'serve' },
  cmd_env = { PYTHONPATH = env.GLM5_REPO },
  init_options = {
    model = { backend = 'openai', url = env.GLM5_URL, name = 'scripted' },
    completion = { debounceMs = 0 },
    budgets = { completionMs = 20000 }, -- behaviour, not latency, is under test (CI may be loaded)
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

local function client_info()
  local client = vim.lsp.get_clients({ bufnr = 0, name = 'glm5' })[1]
  result.filetypes = client.config.filetypes
  result.root_dir = client.root_dir
end

-- "Fix with GLM-5" on a syntax error; the edit is resolved lazily through codeAction/resolve.
local function fix_scenario()
  if not open('fix.py') then
    return finish(false, 'the glm5 client never attached')
  end
  step('attached')
  client_info()
  vim.api.nvim_win_set_cursor(0, { 2, 5 })
  local fixed = false
  for _ = 1, 30 do -- the model may still be loading: ask again until the action comes back
    vim.lsp.buf.code_action({
      apply = true,
      filter = function(action)
        return action.title == 'Fix with GLM-5'
      end,
    })
    fixed = vim.wait(1000, function()
      return vim.api.nvim_buf_get_lines(0, 1, 2, false)[1] == '    return a + b'
    end, 50)
    if fixed then
      break
    end
  end
  result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  if not fixed then
    return finish(false, 'the Fix with GLM-5 action was not applied')
  end
  step('fixed')
  finish(true)
end

-- Type in insert mode, wait for the ghost text, accept it with <Tab>, check the buffer.
local function inline_scenario()
  if not open('greet.py') then
    return finish(false, 'the glm5 client never attached')
  end
  step('attached')
  client_info()
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  local deadline = vim.uv.now() + 30000
  local accepted = false
  local timer = assert(vim.uv.new_timer())
  timer:start(
    100,
    100,
    vim.schedule_wrap(function()
      result.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
      if vim.uv.now() > deadline then
        timer:stop()
        return finish(false, accepted and 'the accepted text never reached the buffer' or 'no ghost text shown')
      end
      if not accepted then
        local namespace = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
        local marks = namespace and vim.api.nvim_buf_get_extmarks(0, namespace, 0, -1, { details = true }) or {}
        if #marks > 0 then
          local chunks = marks[1][4].virt_text or {}
          result.ghost_text = chunks[1] and chunks[1][1] or ''
          step('ghost text')
          accepted = true
          vim.api.nvim_feedkeys(vim.keycode('<Tab>'), 'm', false)
        end
        return
      end
      if result.buffer[2] ~= '    message = ' then
        timer:stop()
        step('accepted')
        return finish(true)
      end
    end)
  )
  -- "A" appends at the end of line 2 ("    message"), then " = " is typed; Neovim asks for the
  -- inline completion itself (InsertEnter/CursorMovedI). '!' keeps insert mode open for the timer.
  vim.api.nvim_feedkeys('A = ', 'ntx!', false)
end

if env.GLM5_SCENARIO == 'fix' then
  fix_scenario()
else
  inline_scenario()
end
