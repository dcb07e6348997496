-- Drives real Neovim (headless) with extension/nvim through the model-free fixes: for each case in
-- GLM5_CASES (a JSON list of {file, line, col}), open the file, put the cursor on the broken line,
-- list the code actions and apply the preferred one that is not "Fix with GLM-5" through Neovim's
-- own vim.lsp.buf.code_action (which resolves the edit with codeAction/resolve), then record the
-- buffer. Run by tests/test_nvim_client.py; environment as nvim_driver.lua's, plus GLM5_CASES.
local env = vim.env
local result = { cases = {} }

local function finish(ok, why)
  result.ok = ok
  result.why = why
  local file = assert(io.open(env.GLM5_RESULT, 'w'))
  file:write(vim.json.encode(result))
  file:close()
  vim.schedule(function()
    vim.cmd(ok and 'qa!' or 'cquit! 3')
  end)
end

-- Whatever happens, Neovim ends within 150 s with what it saw.
vim.defer_fn(function()
  finish(false, 'watchdog: the driver did not finish in 150 s')
end, 150000)

vim.opt.runtimepath:prepend(env.GLM5_EXTENSION)
vim.cmd('filetype on')
vim.lsp.config('glm5', {
  cmd = { env.GLM5_PYTHON, '-m', 'glm5_lsp.cli', 'serve' },
  cmd_env = { PYTHONPATH = env.GLM5_REPO },
  init_options = {
    model = { backend = 'openai', url = env.GLM5_URL, name = 'scripted' },
    completion = { debounceMs = 0 },
    budgets = { completionMs = 20000 },
  },
})
vim.lsp.enable('glm5')

local function attached()
  return vim.wait(30000, function()
    local client = vim.lsp.get_clients({ bufnr = 0, name = 'glm5' })[1]
    return client ~= nil and client.initialized
  end, 50)
end

-- The titles of the actions offered at the cursor (asked directly, to record them).
local function titles()
  local client = vim.lsp.get_clients({ bufnr = 0, name = 'glm5' })[1]
  local params = vim.lsp.util.make_range_params(0, client.offset_encoding)
  params.context = { diagnostics = {}, triggerKind = 1 }
  local answer = vim.lsp.buf_request_sync(0, 'textDocument/codeAction', params, 20000) or {}
  local found, preferred = {}, nil
  for _, response in pairs(answer) do
    for _, action in ipairs(response.result or {}) do
      table.insert(found, action.title)
      if action.isPreferred and action.title ~= 'Fix with GLM-5' then
        preferred = action.title
      end
    end
  end
  return found, preferred
end

local function run_case(case)
  local seen = { file = case.file, steps = {} }
  table.insert(result.cases, seen)
  vim.cmd.edit(env.GLM5_WORKDIR .. '/' .. case.file)
  if not attached() then
    seen.why = 'the glm5 client never attached'
    return false
  end
  local before = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n')
  vim.api.nvim_win_set_cursor(0, { case.line, case.col })
  local chosen
  for _ = 1, 40 do -- the model may still be loading (the fixes need the pipeline): ask again
    local offered
    offered, chosen = titles()
    seen.offered = offered
    if chosen then
      break
    end
    vim.wait(500)
  end
  if not chosen then
    seen.why = 'no model-free fix was offered'
    return false
  end
  seen.chosen = chosen
  vim.lsp.buf.code_action({
    apply = true,
    filter = function(action)
      return action.title == chosen
    end,
  })
  local changed = vim.wait(20000, function()
    return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n') ~= before
  end, 50)
  seen.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  seen.modified = vim.bo.modified
  if not changed then
    seen.why = 'the fix was not applied'
    return false
  end
  vim.cmd('bdelete!')
  return true
end

local cases = vim.json.decode(env.GLM5_CASES)
for _, case in ipairs(cases) do
  if not run_case(case) then
    return finish(false, result.cases[#result.cases].why)
  end
end
finish(true)
