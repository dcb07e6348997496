/**
 * GLM-5 LSP for VS Code: a thin client. It starts `python -m glm5_lsp.cli serve` with the configured
 * Python, passes the `glm5.*` settings as initializationOptions, restarts the server when they
 * change, and adds palette commands that call the server's `glm5.*` commands for the active editor.
 */
import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  TransportKind,
} from "vscode-languageclient/node";

const SECTION = "glm5";
// Settings the extension itself uses; everything else under glm5.* is the server's.
const CLIENT_ONLY = new Set(["server", "trace"]);
const LANGUAGES = ["python", "javascript", "javascriptreact", "typescript", "typescriptreact", "go", "rust", "c", "cpp"];

let client: LanguageClient | undefined;
let restarting: Promise<void> = Promise.resolve();

/** The server's settings: the glm5 section as a nested object, minus the client-only keys. */
export function serverSettings(config: vscode.WorkspaceConfiguration): Record<string, unknown> {
  const settings: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(JSON.parse(JSON.stringify(config)) as Record<string, unknown>)) {
    if (!CLIENT_ONLY.has(key)) {
      settings[key] = value;
    }
  }
  return settings;
}

interface Channels {
  output: vscode.LogOutputChannel;
  trace: vscode.LogOutputChannel;
}

function createClient(channels: Channels): LanguageClient {
  const config = vscode.workspace.getConfiguration(SECTION);
  const python = config.get<string>("server.pythonPath", "python3");
  const serverOptions: ServerOptions = {
    command: python,
    args: ["-m", "glm5_lsp.cli", "serve"],
    transport: TransportKind.stdio,
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: LANGUAGES.flatMap((language) => [
      { scheme: "file", language },
      { scheme: "untitled", language },
    ]),
    initializationOptions: serverSettings(config),
    outputChannel: channels.output,
    traceOutputChannel: channels.trace,
  };
  return new LanguageClient("glm5", "GLM-5", serverOptions, clientOptions);
}

async function start(channels: Channels): Promise<void> {
  client = createClient(channels);
  await client.start();
}

async function restart(channels: Channels): Promise<void> {
  restarting = restarting.then(async () => {
    const old = client;
    client = undefined;
    if (old) {
      await old.stop().catch((error: unknown) => channels.output.error(`stopping the server failed: ${error}`));
    }
    await start(channels);
  });
  return restarting;
}

// The server's own commands ("glm5.generate", "glm5.fix", "glm5.reindex", "glm5.accepted") are registered
// by the language client from the server's executeCommandProvider; VS Code runs an inline completion
// item's command ("glm5.accepted", the acceptance log's record that the user took the suggestion) when
// the user accepts it, and the client forwards it to the server.
async function serverCommand(command: string, args: unknown[]): Promise<unknown> {
  if (!client) {
    void vscode.window.showWarningMessage("The GLM-5 server is not running.");
    return undefined;
  }
  return client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args });
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const channels: Channels = {
    output: vscode.window.createOutputChannel("GLM-5", { log: true }),
    trace: vscode.window.createOutputChannel("GLM-5 Trace", { log: true }),
  };
  context.subscriptions.push(
    channels.output,
    channels.trace,
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration(SECTION)) {
        channels.output.info("glm5.* settings changed: restarting the server");
        void restart(channels);
      }
    }),
    vscode.commands.registerCommand("glm5.restartServer", () => restart(channels)),
    vscode.commands.registerCommand("glm5.fixDocument", async () => {
      const editor = vscode.window.activeTextEditor;
      if (editor) {
        const result = (await serverCommand("glm5.fix", [{ uri: editor.document.uri.toString() }])) as
          | { applied: boolean; reason: string }
          | undefined;
        if (result && !result.applied) {
          void vscode.window.showInformationMessage(`GLM-5: ${result.reason || "nothing to fix"}`);
        }
      }
    }),
    vscode.commands.registerCommand("glm5.generateAtCursor", async () => {
      const editor = vscode.window.activeTextEditor;
      if (editor) {
        const { line, character } = editor.selection.active;
        await serverCommand("glm5.generate", [{ uri: editor.document.uri.toString(), position: { line, character } }]);
      }
    }),
    vscode.commands.registerCommand("glm5.reindexWorkspace", () => serverCommand("glm5.reindex", [])),
  );
  await start(channels);
}

export async function deactivate(): Promise<void> {
  if (client) {
    await client.stop();
    client = undefined;
  }
}
