const maxItems = 10;
let itemCount = 0;
var lastSeen = 'never';
function readConfig(pathName) { return 'x'; }
function writeConfig(pathName) { return 'y'; }
function listItems() { return 'z'; }
